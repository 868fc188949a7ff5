"""Kubernetes and Vertex AI launchers: manifests checked against the real TFJob CRD schema and the
aiplatform proto types; submission logic against a loopback stand-in for the Kubernetes API.

No cluster is reachable here, so the stand-in answers like the API server would; the thing under
test is our render/submit/wait code and the real kubernetes client speaking HTTP."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jsonschema
import pytest
import yaml

from hpml.components.errors import HpmlError, SpecError
from hpml.components.trainer.launchers import kubernetes as k8s
from hpml.components.trainer.launchers import vertex
from hpml.components.trainer.launchers.cluster_job import ClusterJob
from tests.loopback_jobs import reply_json

# The Training Operator's TFJob CRD, kept in the repository (Apache-2.0; infra/schemas/README.md says from where).
TFJOB_CRD = Path(__file__).resolve().parents[1] / "infra" / "schemas" / "kubeflow.org_tfjobs.yaml"


@pytest.fixture(scope="module")
def tfjob_schema():
    crd = yaml.safe_load(TFJOB_CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


MWMS = ClusterJob(name="penguin-train", image="registry.example/hpml:1", job_uri="/mnt/hpml/job.json",
                  strategy="multi_worker_mirrored", num_workers=3, gpus_per_worker=2)
PSS = ClusterJob(name="penguin-pss", image="registry.example/hpml:1", job_uri="gs://bucket/job.json",
                 strategy="parameter_server", num_workers=2, num_ps=1)


def test_mwms_tfjob_is_valid_and_complete(tfjob_schema):
    manifest = k8s.render(MWMS, namespace="ml")
    jsonschema.validate(manifest, tfjob_schema)
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2}
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"] == ["python", "-m", "hpml.components.trainer.worker", "/mnt/hpml/job.json"]
    assert {"name": "TF_USE_LEGACY_KERAS", "value": "1"} in container["env"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError", "wait() quotes the failed worker's log"
    assert manifest["metadata"] == {"name": "penguin-train", "namespace": "ml",
                                    "labels": {"app.kubernetes.io/part-of": "hpml"}}
    assert "activeDeadlineSeconds" not in manifest["spec"]["runPolicy"], "no deadline unless one is given"


def test_a_tfjob_ends_itself_at_the_trainers_wait_limit(tfjob_schema):
    manifest = k8s.render(PSS, deadline_s=90.5)
    jsonschema.validate(manifest, tfjob_schema)
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 91, "whole seconds, never fewer than asked"


def test_pss_tfjob_has_chief_workers_and_ps(tfjob_schema):
    manifest = k8s.render(PSS)
    jsonschema.validate(manifest, tfjob_schema)
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    assert "nvidia.com/gpu" not in replicas["PS"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_the_schema_check_catches_a_broken_manifest(tfjob_schema):
    manifest = k8s.render(MWMS)
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, tfjob_schema)


def test_invalid_jobs_are_refused():
    with pytest.raises(SpecError, match="not a valid Kubernetes name"):
        ClusterJob(name="Penguin_Train", image="i", job_uri="j", strategy="multi_worker_mirrored")
    with pytest.raises(SpecError, match="needs num_ps >= 1"):
        ClusterJob(name="x", image="i", job_uri="j", strategy="parameter_server")


class _FakeApiServer(BaseHTTPRequestHandler):
    """Answers the two TFJob calls like the API server: create, then status as the job progresses."""

    created: list = []
    statuses: list = []  # what each status read answers (the last one repeats); an int is an HTTP error
    gets = 0

    def log_message(self, *args):
        pass

    def _reply(self, code, body):
        reply_json(self, code, body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).created.append((self.path, body))
        self._reply(201, body)

    def do_GET(self):
        if self.path.startswith("/api/v1/"):  # the job's pods: none here (tests/k8s_standin.py has them)
            return self._reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})
        type(self).gets += 1
        status = type(self).statuses.pop(0) if len(type(self).statuses) > 1 else type(self).statuses[0]
        if isinstance(status, int):  # an HTTP error in place of a status
            return self._reply(status, {"kind": "Status", "code": status, "message": f"error {status}"})
        self._reply(200, {"metadata": {"name": self.path.split("/")[-2]}, "status": status})


@pytest.fixture
def api_client():
    from kubernetes import client

    server = HTTPServer(("127.0.0.1", 0), _FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_port}"
    _FakeApiServer.created, _FakeApiServer.gets = [], 0
    yield client.ApiClient(config)
    server.shutdown()


def _condition(kind, message=""):
    return {"conditions": [{"type": "Created", "status": "True"}, {"type": kind, "status": "True", "message": message}]}


def test_submit_and_wait_until_succeeded(api_client):
    _FakeApiServer.statuses = [{}, _condition("Running"), _condition("Succeeded")]
    manifest = k8s.render(MWMS, namespace="ml")
    name = k8s.submit(manifest, api_client)
    assert name == "penguin-train"
    path, body = _FakeApiServer.created[0]
    assert path == "/apis/kubeflow.org/v1/namespaces/ml/tfjobs" and body == manifest
    status = k8s.wait(name, "ml", api_client, timeout_s=10, poll_s=0.01)
    assert status["conditions"][-1]["type"] == "Succeeded"


def test_wait_reports_a_failed_job(api_client):
    _FakeApiServer.statuses = [_condition("Running"), _condition("Failed", "Worker 1 OOMKilled")]
    with pytest.raises(HpmlError, match="TFJob ml/penguin-train failed: Worker 1 OOMKilled"):
        k8s.wait("penguin-train", "ml", api_client, timeout_s=10, poll_s=0.01)


def test_wait_rides_out_transient_status_errors(api_client):
    """A day-long job must not be abandoned (and, since the wait ended first, deleted) over a 503."""
    _FakeApiServer.statuses = [503, 503, _condition("Running"), 429, _condition("Succeeded")]
    status = k8s.wait("penguin-train", "ml", api_client, timeout_s=10, poll_s=0.01)
    assert status["conditions"][-1]["type"] == "Succeeded" and _FakeApiServer.gets == 5


def test_wait_ends_on_a_job_that_is_gone_or_a_server_that_stays_down(api_client):
    from kubernetes.client.rest import ApiException

    _FakeApiServer.statuses = [404]
    with pytest.raises(ApiException) as gone:
        k8s.wait("penguin-train", "ml", api_client, timeout_s=10, poll_s=0.01)
    assert gone.value.status == 404 and _FakeApiServer.gets == 1, "a missing job is not retried"
    _FakeApiServer.statuses, _FakeApiServer.gets = [503], 0
    started = time.monotonic()
    with pytest.raises(ApiException) as down:
        k8s.wait("penguin-train", "ml", api_client, timeout_s=10, poll_s=0.01, outage_s=0.3)
    assert down.value.status == 503 and 0.3 <= time.monotonic() - started < 3
    assert _FakeApiServer.gets > 5, "reads that fail fast are retried for the whole allowance"


def test_the_outage_allowance_is_time_so_slow_failing_reads_do_not_multiply_it():
    """aiplatform retries each read for up to 2 minutes before it raises: counted in reads, 5 retries
    meant a Vertex outage went unnoticed for 10 minutes or more. Counted in time, the wait ends alike."""
    from google.api_core import exceptions

    from hpml.components.trainer.launchers.polling import poll

    reads = []

    def slow_failing_read():
        reads.append(time.monotonic())
        time.sleep(0.2)  # the client's own retries
        raise exceptions.RetryError("read timed out after its retries", None)

    started = time.monotonic()
    with pytest.raises(exceptions.RetryError):
        list(poll(slow_failing_read, what="CustomJob 1", timeout_s=30, poll_s=0.01,
                  transient=vertex._transient, outage_s=0.5))
    # Reads end at about 0.2, 0.4 and 0.6 s: the third is past the allowance (5 retries counted took 1.2 s).
    assert 2 <= len(reads) <= 3 and time.monotonic() - started < 1.0

    answers = iter([RuntimeError("503")] * 3 + ["RUNNING"] + [RuntimeError("503")] * 3 + ["SUCCEEDED"])

    def flaky_read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    seen = []
    for state in poll(flaky_read, what="job", timeout_s=30, poll_s=0.02, transient=lambda e: True, outage_s=1.0):
        seen.append(state)
        if state == "SUCCEEDED":
            break
    assert seen == ["RUNNING", "SUCCEEDED"], "a good read starts the allowance afresh"


def test_vertex_worker_pools_are_valid_protos():
    spec = vertex.custom_job_spec(PSS)
    pools = spec.worker_pool_specs
    assert [p.replica_count for p in pools] == [1, 2, 1]
    assert pools[0].container_spec.image_uri == "registry.example/hpml:1"
    assert list(pools[0].container_spec.args) == ["gs://bucket/job.json"]
    assert not pools[2].machine_spec.accelerator_count, "parameter servers need no accelerator"
    mwms = vertex.custom_job_spec(ClusterJob(name="m", image="i", job_uri="gs://b/j.json",
                                             strategy="multi_worker_mirrored", num_workers=3, gpus_per_worker=1))
    assert [p.replica_count for p in mwms.worker_pool_specs] == [1, 2]
    assert mwms.worker_pool_specs[1].machine_spec.accelerator_type.name == "NVIDIA_TESLA_T4"


def test_vertex_restarts_a_whole_job_only_under_mwms_and_ends_it_at_the_wait_limit():
    assert vertex.scheduling(MWMS, 3600.0) == {"timeout": 3600, "restart_job_on_worker_restart": True}
    assert vertex.scheduling(PSS, 2.5) == {"timeout": 3, "restart_job_on_worker_restart": False}, \
        "the coordinator takes a restarted PS worker back; Vertex counts whole seconds, never fewer than asked"


def test_vertex_waits_through_what_the_client_gives_up_retrying_but_not_a_missing_job():
    from google.api_core import exceptions

    assert vertex._transient(exceptions.RetryError("read timed out after 120 s of retries", None))
    assert vertex._transient(exceptions.ServiceUnavailable("try again"))
    assert not vertex._transient(exceptions.NotFound("customJobs/1"))
    assert not vertex._transient(exceptions.PermissionDenied("aiplatform.customJobs.get"))
