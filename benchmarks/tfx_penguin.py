"""The penguin pipeline on TFX 1.16's LocalDagRunner, timed; run by end_to_end.py with .venv-tfx's Python.

CsvExampleGen -> StatisticsGen -> SchemaGen -> Transform -> Trainer, with hpml's penguin module as the module_file
of TFX's own Transform and Trainer (the same preprocessing_fn and run_fn hpml's engines run). Prints one JSON
line: {"total_s": process wall time, "run_s": LocalDagRunner.run, "components": {id: seconds from MLMD}}.

    .venv-tfx/bin/python benchmarks/tfx_penguin.py PENGUINS_CSV WORK_DIR
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

MODULE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "penguin", "module.py")


def main(csv_path: str, work: str) -> None:
    data = os.path.join(work, "data")
    os.makedirs(data)
    with open(csv_path, encoding="utf-8") as source, open(os.path.join(data, "penguins.csv"), "w") as target:
        for line in source:  # TFX's CSV reader takes an empty cell, not "NA", as missing
            target.write(",".join("" if cell == "NA" else cell for cell in line.rstrip("\n").split(",")) + "\n")
    example_gen = tfx.components.CsvExampleGen(input_base=data)
    statistics = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"])
    transform = tfx.components.Transform(examples=example_gen.outputs["examples"], schema=schema.outputs["schema"],
                                         module_file=MODULE)
    trainer = tfx.components.Trainer(
        module_file=MODULE, examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"], schema=schema.outputs["schema"],
        train_args=tfx.proto.TrainArgs(num_steps=0), eval_args=tfx.proto.EvalArgs(num_steps=0),
        custom_config={"strategy": "one_device"})
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(os.path.join(work, "mlmd.sqlite"))
    pipeline = tfx.dsl.Pipeline(pipeline_name="penguin", pipeline_root=os.path.join(work, "root"),
                                components=[example_gen, statistics, schema, transform, trainer],
                                metadata_connection_config=connection, enable_cache=False)
    run_started = time.perf_counter()
    tfx.orchestration.LocalDagRunner().run(pipeline)
    run_s = time.perf_counter() - run_started
    store = metadata_store.MetadataStore(connection)
    types = {t.id: t.name.rsplit(".", 1)[-1] for t in store.get_execution_types()}
    components = {types[e.type_id]: (e.last_update_time_since_epoch - e.create_time_since_epoch) / 1000
                  for e in store.get_executions()}
    print(json.dumps({"total_s": time.perf_counter() - STARTED, "run_s": run_s, "components": components}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
