"""Gate and Pusher: only a model at least as good as the one in service is pushed, as the next version of a serving
folder in TF Serving's layout, whole and under a number no other push gets."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hpml.components import artifacts, files
from hpml.components.errors import SpecError
from hpml.components.pusher import registry, serving_dir
from hpml.pipelines import records, runner, shipping
from hpml.pipelines.dsl import Node, Pipeline

GOOD = {"epochs": 5, "batch_size": 16, "learning_rate": 0.02}
WORSE = {"epochs": 1, "batch_size": 16, "learning_rate": 1e-6}  # barely moves from its random start


def _run(params: dict, serving: str) -> records.RunSummary:
    from hpml.examples.penguin.pipeline import PIPELINE

    context = runner.run_local(PIPELINE, {**params, "serving_dir": serving})
    return records.load(context.mlflow_run_id)


def _outcome(summary: records.RunSummary) -> dict:
    found = shipping.outcome(summary.outputs)
    assert found is not None, f"the run has no gate verdict: {summary.outputs}"
    return found


def test_a_worse_model_is_held_back_and_the_champion_stays_until_a_better_one_is_pushed(tmp_path):
    serving = str(tmp_path / "serving")

    first = _run(GOOD, serving)
    found = _outcome(first)
    assert found["gate"]["blessed"] and found["gate"]["champion"] is None  # the thresholds alone decide
    assert {k: v for k, v in found["push"].items() if k != "registry_version"} == {
        "pushed": True, "destination": serving, "version": 1, "path": f"{serving}/1", "registered_model": "penguin",
        "already_pushed": False}
    assert serving_dir.versions(serving) == [1]
    assert first.tags["hpml.pushed"] == "true" and first.tags["hpml.pushed_version"] == "1"
    uri = records.tracking_uri()
    assert registry.champion(uri, "penguin") == registry.registry_versions(uri, "penguin", serving)[1]

    second = _run(WORSE, serving)
    found = _outcome(second)
    (check,) = found["gate"]["checks"]
    assert not found["gate"]["blessed"] and not check["passed"]
    assert found["gate"]["champion"] == {"destination": serving, "version": 1}
    assert check["champion"] == pytest.approx(first.eval_metrics["accuracy"], abs=1e-6)  # the same eval split
    assert check["candidate"] < check["champion"] - check["margin"]
    assert found["push"]["pushed"] is False and found["push"]["champion"] == 1
    assert serving_dir.versions(serving) == [1] and serving_dir.champion(serving) == 1
    assert second.tags["hpml.pushed"] == "false" and "hpml.pushed_version" not in second.tags
    assert second.status == "FINISHED"  # holding a model back is the gate doing its job, not a failure

    third = _run(GOOD, serving)
    found = _outcome(third)
    assert found["gate"]["blessed"] and found["gate"]["champion"]["version"] == 1
    assert found["push"]["version"] == 2 and serving_dir.versions(serving) == [1, 2]
    registered = registry.registry_versions(uri, "penguin", serving)
    assert sorted(registered) == [1, 2] and registry.champion(uri, "penguin") == registered[2]
    import mlflow

    # The registry holds the model itself, logged to the pipeline run: any MLflow client fetches the champion.
    client = registry._client(uri)
    champion = client.get_model_version_by_alias("penguin", "champion")
    assert champion.run_id == third.mlflow_run_id
    fetched = mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri("penguin", champion.version),
        dst_path=str(tmp_path / "fetched"), tracking_uri=uri)
    assert _loads_penguin(fetched) == _loads_penguin(f"{serving}/2")

    # Everywhere the run shows, it says whether the model was blessed and why.
    from rich.console import Console

    from hpml.pipelines.summary import print_summary

    console = Console(record=True, width=200)
    print_summary(second, console)
    text = console.export_text()
    assert "model: NOT blessed: accuracy" in text and "not pushed, the champion stays version 1" in text
    page = open(second.tags["hpml.report"], encoding="utf-8").read()
    assert "Gate and push" in page and "NOT blessed" in page and "the champion, version 1 in" in page
    assert f"<td>accuracy</td><td>{check['candidate']:.4f}</td><td>{check['champion']:.4f}</td>" in page
    listing = subprocess.run([sys.executable, "-m", "hpml.pipelines.cli", "runs", "--pipeline", "penguin",
                              "--limit", "3"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "COLUMNS": "200"})
    rows = [line.split() for line in listing.stdout.splitlines() if line.strip()[:8] in
            {s.mlflow_run_id[:8] for s in (first, second, third)}]
    assert [row[-1] for row in rows] == ["v2", "no", "v1"], listing.stdout

    # A rollback moves the serving folder and the registry's alias together.
    rollback = subprocess.run([sys.executable, "-m", "hpml.pipelines.cli", "models", "penguin", "--serving-dir",
                               serving, "--rollback", "1"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "200"})
    assert rollback.returncode == 0, rollback.stderr
    assert rollback.stdout.startswith("champion: version 1; retired 2\n")
    listed = {line.split()[0]: line.split()[1:] for line in rollback.stdout.splitlines()
              if line.split() and line.split()[0].isdigit()}
    assert listed["1"][0] == "champion" and listed["1"][-3:] == [str(registered[1]), "(alias", "champion)"]
    assert listed["2"][0] == "retired" and listed["2"][-1] == str(registered[2]), rollback.stdout
    assert serving_dir.versions(serving) == [1] and serving_dir.retired(serving) == [2]
    assert registry.champion(uri, "penguin") == registered[1]


def _loads_penguin(folder: str) -> list:
    """The classes a SavedModel predicts for the eval split of a fixed penguin (a fingerprint of its weights)."""
    import tensorflow as tf

    example = tf.train.Example(features=tf.train.Features(feature={
        "island": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"Biscoe"])),
        "bill_length_mm": tf.train.Feature(float_list=tf.train.FloatList(value=[45.0])),
        "year": tf.train.Feature(int64_list=tf.train.Int64List(value=[2008]))})).SerializeToString()
    return tf.saved_model.load(folder).signatures["serving_default"](
        examples=tf.constant([example]))["probabilities"].numpy().round(6).tolist()


def _tiny_saved_model(folder: str, padding_bytes: int = 0, tag: float = 0.0) -> str:
    """A Model artifact whose serving SavedModel adds one to its input; `padding_bytes` of assets make it big, and
    models of distinct `tag`s are distinct models (their own weights) that serve the same."""
    import tensorflow as tf

    class AddOne(tf.Module):
        def __init__(self):
            super().__init__()
            self.tag = tf.Variable(tag)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": x + 1.0}

    module = AddOne()
    path = artifacts.serving_model_path(folder)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    if padding_bytes:
        with open(os.path.join(path, "assets", "padding.bin"), "wb") as handle:
            handle.write(os.urandom(1 << 20) * (padding_bytes >> 20))
    return folder


def _blessing(folder: str) -> str:
    os.makedirs(folder)
    open(os.path.join(folder, artifacts.BLESSED_FILE), "w").close()
    return folder


PUSH = textwrap.dedent("""
    import os, sys, time
    from hpml.components.pusher import PUSHER
    models, blessing, destination, out, go = sys.argv[1:6]
    open(out + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while go != "-" and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    for i, model in enumerate(models.split(",")):
        PUSHER.run({"model": model, "model_blessing": blessing}, {"pushed_model": f"{out}-{i}"},
                   {"destination": destination})
""")


def _models(tmp_path, pusher: int, count: int) -> str:
    """`count` distinct models for one pusher, as PUSH takes them."""
    return ",".join(_tiny_saved_model(str(tmp_path / f"model{pusher}-{i}"), tag=pusher * 100 + i)
                    for i in range(count))


def _loads(version_dir: str) -> float:
    import tensorflow as tf

    return float(tf.saved_model.load(version_dir).signatures["serving_default"](x=tf.constant([1.0]))["y"][0])


def test_pushers_finishing_together_get_distinct_versions_each_whole(tmp_path):
    blessing = _blessing(str(tmp_path / "blessing"))
    destination = str(tmp_path / "serving")
    go = str(tmp_path / "go")
    pushers = [subprocess.Popen([sys.executable, "-c", PUSH, _models(tmp_path, n, 4), blessing, destination,
                                 str(tmp_path / f"out{n}"), go]) for n in range(2)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(tmp_path / f"out{n}.ready") for n in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    open(go, "w").close()  # both are imported and waiting: they push at the same moment
    assert [p.wait(timeout=120) for p in pushers] == [0, 0]
    assert serving_dir.versions(destination) == list(range(1, 9))
    pushed = sorted(json.load(open(tmp_path / f"out{n}-{i}" / artifacts.PUSH_FILE))["version"]
                    for n in range(2) for i in range(4))
    assert pushed == list(range(1, 9))  # each push reports the version it made, and none is reported twice
    assert {_loads(serving_dir.version_path(destination, v)) for v in pushed} == {2.0}
    assert [name for name in os.listdir(destination) if name.startswith(".")] == []  # no staging left behind


def test_a_pusher_killed_mid_copy_leaves_no_version_and_the_next_push_takes_version_1(tmp_path):
    model = _tiny_saved_model(str(tmp_path / "model"), padding_bytes=256 << 20)
    blessing = _blessing(str(tmp_path / "blessing"))
    destination = str(tmp_path / "serving")
    pusher = subprocess.Popen([sys.executable, "-c", PUSH, model, blessing, destination, str(tmp_path / "out"),
                               "-"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (os.path.isdir(destination) and any(
            name.startswith(".tmp-push-") for name in os.listdir(destination))):
        time.sleep(0.005)
    pusher.send_signal(signal.SIGKILL)
    pusher.wait(timeout=30)
    staged = [name for name in os.listdir(destination) if name.startswith(".tmp-push-")]
    assert staged, "the pusher was not caught mid-copy"
    assert serving_dir.versions(destination) == []  # TF Serving sees no version: nothing half-written loads
    assert not os.path.exists(tmp_path / "out-0")

    # The next push on this host removes what the dead one left and publishes whole.
    done = subprocess.run([sys.executable, "-c", PUSH, model, blessing, destination, str(tmp_path / "again"),
                           "-"], timeout=120)
    assert done.returncode == 0
    assert os.listdir(destination) == ["1"]
    assert _loads(serving_dir.version_path(destination, 1)) == 2.0
    assert os.path.getsize(os.path.join(destination, "1", "assets", "padding.bin")) == 256 << 20


def test_a_pusher_retried_after_it_published_pushes_nothing_again(tmp_path, monkeypatch):
    """Its task lost after the push (or cleared and run again): the retry finds its model in service, by the
    SavedModel's fingerprint, and reports that version; the registry keeps one version for it. Another model is
    still the next version."""
    from hpml.components.pusher import PUSHER

    monkeypatch.chdir(tmp_path)  # a sqlite tracking URI keeps its runs' artifacts in ./mlruns
    model, other = _tiny_saved_model(str(tmp_path / "model")), _tiny_saved_model(str(tmp_path / "other"), tag=1.0)
    blessing = _blessing(str(tmp_path / "blessing"))
    destination = str(tmp_path / "serving")
    params = {"destination": destination, "registered_model": "retried",
              "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    pushes = [PUSHER.run({"model": model, "model_blessing": blessing}, {"pushed_model": str(tmp_path / f"out{n}")},
                         params)["push"] for n in range(2)]
    assert [(p["version"], p["already_pushed"], p["registry_version"]) for p in pushes] == [(1, False, 1), (1, True, 1)]
    assert serving_dir.versions(destination) == [1]
    assert registry.registry_versions(params["tracking_uri"], "retried", destination) == {1: 1}
    assert shipping.describe({"gate": {"blessed": True, "checks": []}, "push": pushes[1]}).startswith(
        f"blessed; already in service as version 1 in {destination}")

    pushed = PUSHER.run({"model": other, "model_blessing": blessing}, {"pushed_model": str(tmp_path / "out2")},
                        params)["push"]
    assert (pushed["version"], pushed["already_pushed"], pushed["registry_version"]) == (2, False, 2)
    assert registry.champion(params["tracking_uri"], "retried") == 2


def test_a_gs_serving_folder_gives_distinct_whole_versions_to_pushers_on_any_host(tmp_path, gcs):
    """On gs:// (no rename): pushers claim numbers with create-only objects, so two at once never share one; a
    pusher killed mid-upload leaves a number without saved_model.pb, which is no version and is never reused; a
    rollback retires versions there too."""
    import uuid

    model = _tiny_saved_model(str(tmp_path / "model"))
    blessing = _blessing(str(tmp_path / "blessing"))
    destination = f"{gcs.root}/{uuid.uuid4().hex[:8]}/serving"
    assert serving_dir.check_writable(destination) is None
    assert "does not exist" in serving_dir.check_writable("gs://no-such-bucket-hpml/serving")
    go = str(tmp_path / "go")
    pushers = [subprocess.Popen([sys.executable, "-c", PUSH, _models(tmp_path, n, 3), blessing, destination,
                                 str(tmp_path / f"out{n}"), go]) for n in range(2)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(tmp_path / f"out{n}.ready") for n in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    open(go, "w").close()
    assert [p.wait(timeout=300) for p in pushers] == [0, 0]
    pushed = sorted(json.load(open(tmp_path / f"out{n}-{i}" / artifacts.PUSH_FILE))["version"]
                    for n in range(2) for i in range(3))
    assert pushed == list(range(1, 7)) and serving_dir.versions(destination) == pushed
    assert {_loads(serving_dir.version_path(destination, v)) for v in pushed} == {2.0}  # TF reads each whole

    big = _tiny_saved_model(str(tmp_path / "big"), padding_bytes=64 << 20)
    big_serving = artifacts.serving_model_path(big)  # the padding uploads after fingerprint.pb, before the rest
    os.rename(os.path.join(big_serving, "assets", "padding.bin"), os.path.join(big_serving, "variables", "pad.bin"))
    killed = subprocess.Popen([sys.executable, "-c", PUSH, big, blessing, destination, str(tmp_path / "killed"),
                               "-"])
    partial = serving_dir.version_path(destination, 7)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not files.isdir(partial):
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert files.isdir(partial) and not files.exists(f"{partial}/saved_model.pb"), "not caught mid-upload"
    assert serving_dir.versions(destination) == pushed and serving_dir.champion(destination) == 6
    assert serving_dir.publish(artifacts.serving_model_path(model), destination) == 8  # 7 stays taken
    assert "7" not in [name.rstrip("/") for name in files.listdir(destination)], "removed by the next push"

    rollback = subprocess.run([sys.executable, "-m", "hpml.pipelines.cli", "models", "tiny", "--serving-dir",
                               destination, "--rollback", "5"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "200"})
    assert rollback.returncode == 0, rollback.stderr
    assert rollback.stdout.startswith("champion: version 5; retired 6, 8\n"), rollback.stdout
    states = {line.split()[0]: line.split()[1] for line in rollback.stdout.splitlines()
              if line.split() and line.split()[0].isdigit()}
    assert states == {"8": "retired", "6": "retired", "5": "champion",
                      **{str(v): "in" for v in range(1, 5)}}, rollback.stdout
    assert serving_dir.versions(destination) == [1, 2, 3, 4, 5] and serving_dir.retired(destination) == [6, 8]
    assert _loads(f"{destination}/_retired/8") == 2.0 and serving_dir.champion(destination) == 5
    assert serving_dir.publish(artifacts.serving_model_path(model), destination) == 9


def _push_on_a_store(store_root: str, tmp_path, monkeypatch, name: str) -> tuple:
    """A Pusher's (inputs, outputs, params) with its serving folder and PushedModel on a store, and a registry."""
    import uuid

    monkeypatch.chdir(tmp_path)  # a sqlite tracking URI keeps its runs' artifacts in ./mlruns
    model, blessing = _tiny_saved_model(str(tmp_path / "model")), _blessing(str(tmp_path / "blessing"))
    root = f"{store_root}/{uuid.uuid4().hex[:8]}"
    params = {"destination": f"{root}/serving", "registered_model": name,
              "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    return {"model": model, "model_blessing": blessing}, {"pushed_model": f"{root}/Pusher/pushed_model"}, params


def test_a_pusher_cut_off_mid_push_whose_retry_pushed_makes_no_second_version(tmp_path, gcs, monkeypatch):
    """A Pusher attempt cut off as it began its upload, retried meanwhile: the retry pushes and registers the model.
    When the first attempt gets its network back it finishes nothing: no second version of the same model, no second
    registry version, and the alias stays on the retry's."""
    from hpml.components.errors import TakenOver
    from hpml.components.pusher import PUSHER

    run = _push_on_a_store(gcs.root, tmp_path, monkeypatch, "cut_off")
    params = run[2]
    publish, retry = serving_dir.publish, []

    def retried_while_cut_off(*args):
        if not retry:  # the first attempt's network goes; its retry begins, pushes and publishes
            retry.append(None)
            time.sleep(0.01)
            retry[0] = PUSHER.run(*run)["push"]
        return publish(*args)

    monkeypatch.setattr(serving_dir, "publish", retried_while_cut_off)
    with pytest.raises(TakenOver, match="began after this one published it"):
        PUSHER.run(*run)
    assert (retry[0]["version"], retry[0]["registry_version"]) == (1, 1)
    assert serving_dir.versions(params["destination"]) == [1]
    assert registry.registry_versions(params["tracking_uri"], "cut_off", params["destination"]) == {1: 1}
    assert registry.champion(params["tracking_uri"], "cut_off") == 1
    assert json.loads(files.read_text(f"{run[1]['pushed_model']}/{artifacts.PUSH_FILE}")) == retry[0]


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_a_pusher_back_while_its_retry_pushes_leaves_the_push_to_the_retry(store, request, tmp_path, monkeypatch):
    """The first attempt gets its network back while its retry is still uploading: the retry signed the PushedModel
    when it began (on s3://, where the PushedModel is uploaded at the end, before anything else), so the first
    attempt makes no version, and the retry's push is the only one."""
    import threading

    from hpml.components.errors import TakenOver
    from hpml.components.pusher import PUSHER

    run = _push_on_a_store(request.getfixturevalue(store).root, tmp_path, monkeypatch, "back_early")
    params = run[2]
    publish, retry_uploading, first_done, retry = serving_dir.publish, threading.Event(), threading.Event(), []

    def interleaved(*args):
        if threading.current_thread() is threading.main_thread():  # the first attempt, cut off here
            time.sleep(0.01)
            threading.Thread(target=lambda: retry.append(PUSHER.run(*run)["push"]), daemon=True).start()
            assert retry_uploading.wait(120), "the retry did not reach its upload"
            try:
                return publish(*args)  # its network is back: it goes on
            finally:
                first_done.set()
        retry_uploading.set()
        assert first_done.wait(120)
        return publish(*args)

    monkeypatch.setattr(serving_dir, "publish", interleaved)
    with pytest.raises(TakenOver, match="began after this one is writing it"):
        PUSHER.run(*run)
    deadline = time.monotonic() + 120
    while not retry and time.monotonic() < deadline:
        time.sleep(0.05)
    assert retry, "the retry did not finish"
    version = retry[0]["version"]  # the first attempt claimed a number before it stopped
    assert serving_dir.versions(params["destination"]) == [version]
    assert registry.registry_versions(params["tracking_uri"], "back_early", params["destination"]) == {version: 1}
    assert json.loads(files.read_text(f"{run[1]['pushed_model']}/{artifacts.PUSH_FILE}")) == retry[0]


def test_a_push_to_a_store_removes_uploads_whose_pusher_is_gone_and_keeps_their_numbers(tmp_path, gcs):
    """What pushers that died mid-upload leave on gs:// (a claimed number, a folder without saved_model.pb): the
    next push removes the folder of one that ran on this host and has ended, and of one on another host that
    started hours ago; an upload another host started a moment ago stays. No number is given twice."""
    import socket
    import uuid

    destination = f"{gcs.root}/{uuid.uuid4().hex[:8]}/serving"
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    now = time.time()
    pushers = {1: (socket.gethostname(), ended.pid, now), 2: ("other-host", 1, now - 7 * 3600),
               3: ("other-host", 1, now)}
    for number, (host, pid, started) in pushers.items():
        files.write_text(f"{destination}/{serving_dir.CLAIMS_DIR}/{number}",
                         json.dumps({"host": host, "pid": pid, "model": "m", "started": started}))
        files.write_text(f"{destination}/{number}/variables/variables.index", "part of an upload")
    model = _tiny_saved_model(str(tmp_path / "model"))
    assert serving_dir.publish(artifacts.serving_model_path(model), destination) == 4
    # Listed, not stat-ed: TensorFlow's gs:// client caches a stat for a few seconds.
    assert sorted(name.rstrip("/") for name in files.listdir(destination)) == ["3", "4", serving_dir.CLAIMS_DIR]
    assert serving_dir.versions(destination) == [4]
    assert serving_dir.publish(artifacts.serving_model_path(model), destination) == 5  # 1 and 2 stay taken


def test_a_model_that_is_not_blessed_is_not_pushed(tmp_path):
    from hpml.components.pusher import PUSHER

    model = _tiny_saved_model(str(tmp_path / "model"))
    blessing = str(tmp_path / "blessing")
    os.makedirs(blessing)
    open(os.path.join(blessing, artifacts.NOT_BLESSED_FILE), "w").close()  # as TFX's Evaluator leaves it
    result = PUSHER.run({"model": model, "model_blessing": blessing}, {"pushed_model": str(tmp_path / "out")},
                        {"destination": str(tmp_path / "serving")})
    assert result["push"]["pushed"] is False and result["push"]["reason"] == "not blessed"
    assert serving_dir.versions(str(tmp_path / "serving")) == []


def test_a_rollback_retires_newer_versions_whose_numbers_are_never_given_again(tmp_path):
    model = _tiny_saved_model(str(tmp_path / "model"))
    destination = str(tmp_path / "serving")
    for _ in range(3):
        serving_dir.publish(artifacts.serving_model_path(model), destination)
    assert serving_dir.retire_above(destination, 1) == [3, 2]
    assert serving_dir.versions(destination) == [1] and serving_dir.retired(destination) == [2, 3]
    assert serving_dir.publish(artifacts.serving_model_path(model), destination) == 4
    with pytest.raises(SpecError, match="version 2 is not in service"):
        serving_dir.retire_above(destination, 2)


def test_bad_gate_and_pusher_parameters_fail_before_anything_runs(tmp_path, penguin_csv):
    from hpml.components.example_gen import EXAMPLE_GEN
    from hpml.components.gate import GATE
    from hpml.examples.penguin.pipeline import PIPELINE

    with pytest.raises(SpecError, match=r"^Pusher: parameter 'destination': .*/hostname is a file, not a folder"):
        PIPELINE.validate({"serving_dir": "/etc/hostname/models"})
    with pytest.raises(SpecError, match=r"Gate: parameter 'thresholds': names metric 'auc', which the gate does "
                                        r"not compute; it computes accuracy, loss, mae, r2"):
        GATE.resolve_params({"label_key": "species", "thresholds": {"auc": 0.9}})
    pipeline = Pipeline(
        name="gated", params_schema={"type": "object", "properties": {}},
        nodes=(Node("ExampleGen", EXAMPLE_GEN, params=lambda p: {"input_path": penguin_csv}),
               Node("Gate", GATE, inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema"),
                                          "model": ("ExampleGen", "examples")},
                    params=lambda p: {"label_key": "species", "margins": {"recall": 0.1}})))
    with pytest.raises(SpecError, match="names metric 'recall'"):
        runner.run_local(pipeline, {})
    assert not os.path.exists(os.path.join(os.environ["HPML_HOME"], "artifacts", "gated"))  # nothing ran


def test_the_gate_scores_both_models_on_the_same_examples_in_one_pass(penguin_outputs, tmp_path):
    """With the shared run's model as its own baseline, candidate and champion scores are equal, and match the
    Trainer's eval accuracy."""
    from hpml.components.gate import GATE

    out = str(tmp_path / "blessing")
    result = GATE.run({"examples": penguin_outputs["ExampleGen"]["examples"],
                       "schema": penguin_outputs["ExampleGen"]["schema"], "model": penguin_outputs["Trainer"]["model"],
                       "baseline_model": penguin_outputs["Trainer"]["model"]},
                      {"blessing": out}, {"label_key": "species", "thresholds": {"accuracy": 0.0, "loss": 100.0},
                                          "margins": {"accuracy": 0.0, "loss": 0.0}, "batch_size": 7})
    blessing = result["blessing"]
    assert blessing["scores"]["candidate"] == blessing["scores"]["champion"]
    metrics = json.load(open(os.path.join(penguin_outputs["Trainer"]["model_run"], artifacts.EVAL_METRICS_FILE)))
    assert blessing["scores"]["candidate"]["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    assert blessing["scores"]["candidate"]["loss"] == pytest.approx(metrics["loss"], rel=1e-3)
    assert blessing["blessed"] and sorted(os.listdir(out)) == [artifacts.BLESSED_FILE, artifacts.GATE_FILE]
    assert np.isclose(blessing["examples"], sum(1 for _ in _eval_records(penguin_outputs)))
    # A regressor's metric asked of a classifier is refused before any example is read, and nothing is published.
    refused = str(tmp_path / "refused")
    with pytest.raises(SpecError, match=r"^Gate: r2 is not a metric of a classifier$") as refusal:
        GATE.run({"examples": penguin_outputs["ExampleGen"]["examples"], "schema": penguin_outputs["ExampleGen"][
            "schema"], "model": penguin_outputs["Trainer"]["model"]}, {"blessing": refused},
                 {"label_key": "species", "thresholds": {"r2": 0.0}})
    assert refusal.value.hint == "a classifier's metrics: accuracy, loss" and not os.path.exists(refused)


def test_an_eval_example_without_its_label_fails_the_gate_naming_the_split_and_the_label(penguin_outputs, tmp_path):
    """An eval split where one example lacks the label is refused with an error naming the label and the files, and
    no blessing is published; the same split with every label there is scored whole."""
    import tensorflow as tf

    from hpml.components.errors import InputDataError
    from hpml.components.gate import GATE

    records_ = [tf.train.Example.FromString(r.numpy()) for r in _eval_records(penguin_outputs)]
    examples = str(tmp_path / "examples")
    pattern = artifacts.examples_file_pattern(examples, "eval")
    os.makedirs(os.path.dirname(pattern))
    with tf.io.TFRecordWriter(pattern.replace("*", "00000-of-00001"), "GZIP") as writer:
        for index, example in enumerate(records_):
            if index == 5:
                del example.features.feature["species"]
            writer.write(example.SerializeToString())
    inputs = {"examples": examples, "schema": penguin_outputs["ExampleGen"]["schema"],
              "model": penguin_outputs["Trainer"]["model"]}
    params = {"label_key": "species", "thresholds": {"accuracy": 0.0}, "batch_size": 4}
    with pytest.raises(InputDataError) as refusal:
        GATE.run(inputs, {"blessing": str(tmp_path / "refused")}, params)
    assert str(refusal.value) == (  # the sixth example, in the second batch of 4
        f"Gate: {pattern}: an example's label 'species' is missing or not one value, in examples 5-8 of the split "
        "(Feature: species (data type: string) is required but could not be found.)")
    assert not os.path.exists(tmp_path / "refused")
    whole = GATE.run({**inputs, "examples": penguin_outputs["ExampleGen"]["examples"]},
                     {"blessing": str(tmp_path / "blessing")}, params)["blessing"]
    assert whole["examples"] == len(records_) and whole["blessed"]


def _eval_records(outputs: dict):
    import tensorflow as tf

    pattern = artifacts.examples_file_pattern(outputs["ExampleGen"]["examples"], "eval")
    return tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")


SERVE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    version_dir, examples_file, raw_file, out = sys.argv[1:5]
    loaded = tf.saved_model.load(version_dir)
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(examples_file)]
    from_examples = loaded.signatures["serving_default"](examples=tf.constant(serialized))["probabilities"]
    raw = json.load(open(raw_file))
    inputs = {name: tf.constant(values, dtype=getattr(tf, kind)) for name, (kind, values) in raw.items()}
    from_raw = loaded.signatures["serving_raw"](**inputs)["probabilities"]
    np.savez(out, examples=from_examples.numpy(), raw=from_raw.numpy())
    assert not [name for name in sys.modules if name.split(".")[0] == "hpml"]
""")


def test_a_pushed_model_serves_raw_features_and_tf_examples_in_tensorflow_alone(penguin_outputs, tmp_path):
    """In a fresh process with only TensorFlow: the pushed SavedModel predicts from serialized raw tf.Examples and
    from raw feature values (a missing value as NaN or ""), and both match the Trainer's own model on the same
    examples."""
    import tensorflow as tf
    import tensorflow_transform as tft

    from hpml.components.pusher import PUSHER
    from hpml.components.trainer.export import raw_input_dtype

    model = penguin_outputs["Trainer"]["model"]
    result = PUSHER.run({"model": model, "model_blessing": _blessing(str(tmp_path / "blessing"))},
                        {"pushed_model": str(tmp_path / "pushed")}, {"destination": str(tmp_path / "serving")})
    version_dir = result["push"]["path"]

    serialized = [r.numpy() for r in _eval_records(penguin_outputs)]
    examples_file = str(tmp_path / "eval.tfrecord")
    with tf.io.TFRecordWriter(examples_file) as writer:
        for record in serialized:
            writer.write(record)
    transform_output = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    raw_spec = {k: v for k, v in transform_output.raw_feature_spec().items() if k != "species"}
    raw, missing = {}, 0
    for name, feature in raw_spec.items():
        kind = feature.dtype.name
        blank = "" if kind == "string" else float("nan") if isinstance(feature, tf.io.VarLenFeature) else None
        column = []
        for record in serialized:
            values = getattr(tf.train.Example.FromString(record).features.feature[name],
                             {"float32": "float_list", "int64": "int64_list", "string": "bytes_list"}[kind]).value
            missing += not values
            column.append((values[0].decode() if kind == "string" else values[0]) if values else blank)
        assert None not in column, f"{name} is missing where it cannot be"
        raw[name] = [raw_input_dtype(feature).name, column]
    assert missing, "the eval split has missing values, which the raw signature must take"
    json.dump(raw, open(tmp_path / "raw.json", "w"))

    out = str(tmp_path / "served.npz")
    done = subprocess.run([sys.executable, "-c", SERVE, version_dir, examples_file, str(tmp_path / "raw.json"), out],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    served = np.load(out)

    # The Trainer's own predictions: its Model artifact's signature, in this process.
    trained = tf.saved_model.load(artifacts.serving_model_path(model)).signatures["serving_default"]
    own = trained(examples=tf.constant(serialized))["probabilities"].numpy()
    assert own.shape == (len(serialized), 3)
    np.testing.assert_allclose(served["examples"], own, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served["raw"], own, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_a_store_destination_another_pusher_is_checking_reads_as_empty_not_missing(store, request):
    """Another pusher's write check puts an object in an empty destination and removes it: in between, the folder
    exists and then has nothing in it. Its versions, retired versions and the next push read that as empty."""
    import threading
    import uuid

    root = request.getfixturevalue(store).root
    destination = f"{root}/{uuid.uuid4().hex[:8]}/serving"
    stop = threading.Event()
    checks = []

    def check_in_a_loop():
        while not stop.is_set() and len(checks) < 2000:
            checks.append(serving_dir.check_writable(destination))

    checker = threading.Thread(target=check_in_a_loop)
    checker.start()
    try:
        read = [(serving_dir.versions(destination), serving_dir.retired(destination)) for _ in range(300)]
    finally:
        stop.set()
        checker.join(timeout=60)
    assert len(checks) > 10 and set(checks) == {None}
    assert set(map(str, read)) == {"([], [])"}
