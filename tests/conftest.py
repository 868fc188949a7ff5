"""Shared fixtures. Every test uses real parts: Beam's in-process runner, TF, SQLite MLflow and Airflow.

State (artifacts, MLflow store, Airflow DB) lives in a per-session temporary HPML_HOME, set
before anything imports airflow or mlflow.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile

# tests/tfx_conformance runs in the TFX 1.16 environment (`make test-tfx`); the main environment has no tfx.
try:
    importlib.metadata.distribution("tfx")
    collect_ignore = []
except importlib.metadata.PackageNotFoundError:
    collect_ignore = ["tfx_conformance"]

if "conftest" in sys.modules and "tests.conftest" in sys.modules:
    raise ImportError("tests/conftest.py was imported a second time (as tests.conftest), which would start a new "
                      "session HPML_HOME mid-session: import shared helpers from tests.helpers instead")

_SESSION_HOME = tempfile.mkdtemp(prefix="hpml-test-")
os.environ["HPML_HOME"] = _SESSION_HOME
os.environ["AIRFLOW_HOME"] = os.path.join(_SESSION_HOME, "airflow")
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_HOME, "cache")  # tuned steps: measured afresh each session
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("HPML_ARTIFACT_ROOT", None)
os.environ["HPML_DATA_ROOTS"] = tempfile.gettempdir()
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.helpers import TINY_EPOCHS  # noqa: E402

# Four logical CPU devices stand in for GPUs (Mirrored, CentralStorage, GPipe stages).
# This must happen before TensorFlow initialises its devices.
LOGICAL_CPUS = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS
)


@pytest.fixture(scope="session")
def penguin_csv() -> str:
    from hpml.examples.penguin.pipeline import penguins_csv

    return penguins_csv()


@pytest.fixture(scope="session")
def airflow_db():
    """A migrated SQLite Airflow metadata DB for this session."""
    from hpml.pipelines.airflow import local as airflow_local

    airflow_local.migrate()
    return os.environ["AIRFLOW_HOME"]


@pytest.fixture(scope="session")
def penguin_dag_run(airflow_db):
    """One real Airflow DAG run of the penguin pipeline, shared by the tests that inspect it."""
    from hpml.pipelines import records
    from hpml.pipelines.airflow import local as airflow_local

    conf = {"epochs": TINY_EPOCHS, "batch_size": 16, "strategy": "one_device", "learning_rate": 0.02}
    dag_run = airflow_local.test_run("penguin", conf)
    mlflow_run_id = records.find("airflow.run_id", dag_run.run_id, "penguin")
    return {"dag_run": dag_run, "conf": conf, "mlflow_run_id": mlflow_run_id,
            "summary": records.load(mlflow_run_id) if mlflow_run_id else None}


@pytest.fixture(scope="session")
def penguin_outputs(penguin_dag_run):
    """{node: {output: uri}} of the shared DAG run."""
    return penguin_dag_run["summary"].outputs


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """A real Airflow (api-server, scheduler, dag-processor) on loopback with the project's DAGs, manual runs only;
    shared by the browser tests and the tests that stop a running task."""
    from airflow_stack import AirflowStack

    airflow = AirflowStack(tmp_path_factory.mktemp("airflow-ui"), {"HPML_SCHEDULE": "none"}).start()
    airflow.wait_for_dag("penguin")
    yield airflow
    airflow.stop()


@pytest.fixture(scope="session")
def gcs_server():
    """gcp-storage-emulator on loopback with the front TF goes through (tests/object_store.py), for the session."""
    from tests.object_store import GcsServer

    server = GcsServer().start()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """The object store, with this process's TF, Beam and google-cloud-storage pointed at it for one test."""
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)
    return gcs_server


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on loopback (tests/s3_store.py), for the session."""
    from tests.s3_store import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, with this process's boto3 pointed at it (the standard AWS variables) for one test."""
    from hpml.components import s3_files

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    s3_files.forget_clients()
    yield s3_server
    s3_files.forget_clients()


@pytest.fixture(scope="session")
def cluster():
    """Test hosts (network namespaces on a bridge, tests/cluster.py): control, storage, worker1 and worker2."""
    from tests.cluster import Cluster

    hosts = Cluster().up()
    yield hosts
    hosts.down()


@pytest.fixture(scope="session")
def cluster_store(cluster):
    """The gs:// object store on the storage host; no folder is shared between hosts."""
    from tests.cluster_services import ClusterStore

    return ClusterStore(cluster).start()


@pytest.fixture(scope="session")
def cluster_s3(cluster):
    """An s3:// store on the storage host (moto's server); no folder is shared between hosts."""
    from tests.cluster_services import ClusterS3

    return ClusterS3(cluster).start()


@pytest.fixture(scope="session")
def slurm(cluster):
    """Slurm on the test hosts: the controller on control, a node on each worker host."""
    from tests.cluster_services import SlurmCluster

    return SlurmCluster(cluster).start()


@pytest.fixture(scope="session")
def store_penguin(cluster_store, penguin_csv):
    """Penguin's ExampleGen and Transform outputs on the cluster's store, made once from this process."""
    from hpml.components.example_gen import EXAMPLE_GEN
    from hpml.components.transform import TRANSFORM
    from tests.helpers import store_env

    root = f"{cluster_store.root}/penguin"
    gen = {"examples": f"{root}/examples", "schema": f"{root}/schema"}
    transform = {key: f"{root}/{key}" for key in ("transform_graph", "transformed_examples", "input_pipeline")}
    with store_env(cluster_store.env(None)):
        EXAMPLE_GEN.run({}, gen, {"input_path": penguin_csv})
        TRANSFORM.run(gen, transform, {"module": "hpml.examples.penguin.module"})
    return {"ExampleGen": gen, "Transform": transform}


@pytest.fixture(scope="session")
def cluster_airflow(cluster, cluster_store):
    """Airflow on Celery across the test hosts (tests/cluster_services.py: ClusterAirflow)."""
    import shutil

    from tests.cluster_services import ClusterAirflow

    airflow = ClusterAirflow(cluster, cluster_store)
    try:
        yield airflow.start()
    finally:
        shutil.rmtree(airflow.code, ignore_errors=True)


# `make test` runs the suite in two processes (pytest-xdist): much of it waits on subprocesses. Tests that share a
# session fixture that must exist once per machine, or is costly, run in one process, one after another: the test
# hosts (network namespaces with fixed names) and the Airflow stack. They are grouped by file, so each such fixture
# may be asked for only in its files (checked at collection); the test hosts' group goes first, being the longest.
# xdist's own `--dist loadgroup` cannot do this under pytest 9 (its group suffix no longer reaches the node id).
SHARED_ONCE = {"cluster": ("tests/test_hosts_", "test-hosts"),
               "stack": (("tests/test_browser.py", "tests/test_airflow_stop.py"), "airflow-stack")}

def _shared_group(nodeid: str) -> str | None:
    for prefixes, group in SHARED_ONCE.values():
        if nodeid.startswith(prefixes):
            return group
    return None

def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, (prefixes, _) in SHARED_ONCE.items():
            parametrized = getattr(getattr(item, "callspec", None), "params", {})  # an argument of that name
            if fixture in getattr(item, "fixturenames", ()) and fixture not in parametrized \
                    and not item.nodeid.startswith(prefixes):
                raise pytest.UsageError(f"{item.nodeid} asks for the `{fixture}` fixture, which is shared by one "
                                        f"process's tests only: move the test to a file that starts with {prefixes}")
    items.sort(key=lambda item: _shared_group(item.nodeid) != "test-hosts")  # stable: the order is kept otherwise

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedOnceScheduling(LoadScopeScheduling):
        """Each test is a unit of its own, but the tests of one SHARED_ONCE group are one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return _shared_group(nodeid) or nodeid

    return SharedOnceScheduling(config, log)


def pytest_unconfigure(config):
    """The session's HPML_HOME goes with the session: a whole `make test` leaves several GB of runs in each process's
    home. HPML_KEEP_TEST_HOME=1 keeps it, to look into a failure."""
    if not os.environ.get("HPML_KEEP_TEST_HOME"):
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)
