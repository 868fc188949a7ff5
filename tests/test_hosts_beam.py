"""Beam across hosts: ExampleGen and Transform drive Beam's portable runner from the control host, their work runs in
EXTERNAL SDK worker pools on the worker hosts, and every byte between them goes through the object store on the
storage host. The outputs equal a one-host run's, though a worker host is cut off for 30 s mid-run."""
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.cluster_services import beam_job_service, beam_worker_pool, portable_args
from tests.test_beam_processes import _assets, _records, _rows

DRIVER = """
import json, sys
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.transform import TRANSFORM
gen, transform, csv, example_gen_args, transform_args = json.loads(sys.argv[1])
EXAMPLE_GEN.run({}, gen, {"input_path": csv, "beam_pipeline_args": example_gen_args})
TRANSFORM.run(gen, transform, {"module": "hpml.examples.penguin.module", "beam_pipeline_args": transform_args})
"""


@pytest.fixture(scope="module")
def beam_hosts(cluster, cluster_store):
    """Beam's EXTERNAL worker pools on worker1 and worker2, and a job service on the control host."""
    for host in (cluster["worker1"], cluster["worker2"]):
        beam_worker_pool(host, cluster_store.env(host))
    beam_job_service(cluster["control"], cluster_store.env(cluster["control"]))
    return cluster


def _outputs(root: str) -> tuple[dict, dict]:
    gen = {"examples": f"{root}/examples", "schema": f"{root}/schema"}
    return gen, {key: f"{root}/{key}" for key in ("transform_graph", "transformed_examples", "input_pipeline")}


def test_example_gen_and_transform_on_other_hosts_write_what_one_host_writes_though_a_host_is_cut_off_for_30s(
        beam_hosts, cluster_store, penguin_csv, tmp_path, monkeypatch):
    """The driver on the control host: ExampleGen's work on worker1's pool, Transform's on worker2's. worker1's
    network is cut while its pool runs ExampleGen's work and restored 30 s later: the component waits, then
    finishes, and everything published is whole and equals a one-host run's."""
    import json
    import time

    from hpml.components import artifacts
    from hpml.components.example_gen import EXAMPLE_GEN
    from hpml.components.transform import TRANSFORM

    control, worker1, worker2 = beam_hosts["control"], beam_hosts["worker1"], beam_hosts["worker2"]
    for name, value in cluster_store.env(None).items():
        monkeypatch.setenv(name, value)
    csv = f"{cluster_store.root}/beam/penguins.csv"
    tf.io.gfile.copy(penguin_csv, csv, overwrite=True)
    gen, transform = _outputs(f"{cluster_store.root}/beam/hosts")
    pool_log = worker1.dir / "beam-pool.log"
    starts = pool_log.read_text(errors="replace").count("Starting worker")
    driver_log = tmp_path / "driver.log"
    started = time.monotonic()
    driver = control.popen(["python", "-c", DRIVER, json.dumps([gen, transform, csv, portable_args(worker1),
                                                                 portable_args(worker2)])],
                           env=cluster_store.env(control), log=driver_log)
    deadline = time.monotonic() + 180
    while pool_log.read_text(errors="replace").count("Starting worker") == starts:  # the work reached worker1
        assert driver.poll() is None and time.monotonic() < deadline, driver_log.read_text()[-3000:]
        time.sleep(0.1)
    worker1.disconnect()
    try:
        time.sleep(30)
        assert driver.poll() is None, "the component waits for the host it lost"
    finally:
        worker1.reconnect()
    assert driver.wait(timeout=300) == 0, driver_log.read_text()[-3000:]
    assert time.monotonic() - started > 30
    # worker1's pool started the SDK worker that ran ExampleGen (the wait above); worker2's ran Transform after the
    # cut was over, calling back to the driver's host by name, and nothing went wrong there.
    transform_pool = (worker2.dir / "beam-pool.log").read_text(errors="replace")
    assert 'SdkHarness("control:' in transform_pool and "Traceback" not in transform_pool, transform_pool[-3000:]
    assert not os.path.exists(control.dir / "tmp" / "beam-temp"), "no work on the control host's disk"

    artifacts.require_published(gen["examples"], "Examples")
    local_gen, local_transform = _outputs(str(tmp_path / "one_host"))
    EXAMPLE_GEN.run({}, local_gen, {"input_path": penguin_csv, "beam_pipeline_args": []})
    TRANSFORM.run(local_gen, local_transform, {"module": "hpml.examples.penguin.module"})
    for split in ("train", "eval"):
        assert _records(gen["examples"], split) == _records(local_gen["examples"], split)
        np.testing.assert_allclose(_rows(transform["transformed_examples"], split),
                                   _rows(local_transform["transformed_examples"], split), rtol=1e-6, atol=1e-6)
    assert tf.io.gfile.GFile(f"{gen['schema']}/schema.pbtxt").read() == \
        open(f"{local_gen['schema']}/schema.pbtxt").read()
    assert _assets(transform["transform_graph"]) == _assets(local_transform["transform_graph"])
