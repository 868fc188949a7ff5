"""TFX 1.16's ingestion and preprocessing chain on one CSV, timed; run by scale.py with .venv-tfx's Python.

CsvExampleGen -> StatisticsGen -> SchemaGen -> Transform on TFX's LocalDagRunner, in one process, with the
`module_file` that `hpml init` wrote for the same CSV (the preprocessing_fn hpml's Transform runs). Beam runs on
its in-process DirectRunner, as hpml's does by default. Prints one JSON line: {"total_s", "peak_rss_mib",
"components": {name: seconds from MLMD}}.

    .venv-tfx/bin/python benchmarks/tfx_scale.py CSV MODULE_FILE WORK_DIR
"""
from __future__ import annotations

import json
import os
import sys
import time

STARTED = time.perf_counter()
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from ml_metadata.metadata_store import metadata_store  # noqa: E402
from tfx import v1 as tfx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import peak_rss_mib  # noqa: E402


def main(csv_path: str, module_file: str, work: str) -> None:
    data = os.path.join(work, "data")
    os.makedirs(data)
    os.symlink(os.path.abspath(csv_path), os.path.join(data, "data.csv"))
    example_gen = tfx.components.CsvExampleGen(input_base=data)
    statistics = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"])
    transform = tfx.components.Transform(examples=example_gen.outputs["examples"], schema=schema.outputs["schema"],
                                         module_file=module_file)
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(os.path.join(work, "mlmd.sqlite"))
    pipeline = tfx.dsl.Pipeline(pipeline_name="scale", pipeline_root=os.path.join(work, "root"),
                                components=[example_gen, statistics, schema, transform],
                                metadata_connection_config=connection, enable_cache=False,
                                beam_pipeline_args=["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    tfx.orchestration.LocalDagRunner().run(pipeline)
    store = metadata_store.MetadataStore(connection)
    types = {t.id: t.name.rsplit(".", 1)[-1] for t in store.get_execution_types()}
    components = {types[e.type_id]: (e.last_update_time_since_epoch - e.create_time_since_epoch) / 1000
                  for e in store.get_executions()}
    print(json.dumps({"total_s": time.perf_counter() - STARTED, "peak_rss_mib": peak_rss_mib(),
                      "components": components}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
