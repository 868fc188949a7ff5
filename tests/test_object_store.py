"""Artifacts on an object store (gs://, gcp-storage-emulator on loopback): publishing without a rename, a writer
killed mid-write, and readers that take only whole artifacts."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from hpml.components import artifacts, files, publishing
from hpml.components.errors import SpecError
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.transform import TRANSFORM


def _objects(gcs, prefix: str) -> dict[str, int]:
    """{object name under prefix: size}, as the server lists them (Python's client, not TF's), without the empty
    objects that stand for folders."""
    from google.cloud import storage

    client = storage.Client(project="hpml-test")
    bucket_prefix = prefix[len(gcs.root) + 1:].rstrip("/") + "/"
    return {blob.name[len(bucket_prefix):]: blob.size for blob in client.list_blobs(gcs.bucket, prefix=bucket_prefix)
            if not blob.name.endswith("/")}


def _manifest(uri: str) -> dict[str, int]:
    return json.loads(files.read_text(os.path.join(uri, artifacts.PUBLISHED_FILE)))["files"]


def test_publishing_writes_in_place_and_the_manifest_last(gcs, tmp_path):
    uri = f"{gcs.root}/{tmp_path.name}/Component/out"
    with publishing.publish(uri) as out:
        assert out == uri, "an object store has no rename: the artifact is written where it will stay"
        files.makedirs(os.path.join(out, "Split-train"))
        files.write_text(os.path.join(out, "Split-train", "part-0.gz"), "x" * 10)
        files.write_text(os.path.join(out, "schema.pbtxt"), "feature {}")
        with pytest.raises(SpecError, match=artifacts.PUBLISHED_FILE):
            artifacts.require_published(uri, "Examples")  # readers refuse it while it is written
    assert _manifest(uri) == {"Split-train/part-0.gz": 10, "schema.pbtxt": 10}
    artifacts.require_published(uri, "Examples")
    stored = _objects(gcs, uri)
    assert stored == {"Split-train/part-0.gz": 10, "schema.pbtxt": 10,
                      artifacts.PUBLISHED_FILE: stored[artifacts.PUBLISHED_FILE]}


def test_the_test_store_keeps_nothing_it_deleted(gcs, tmp_path):
    """The emulator rewrites its metadata, soft-deleted objects included, on every write: a store that kept what
    the tests delete would grow slower test after test."""
    import urllib.request

    uri = f"{gcs.root}/{tmp_path.name}/deleted"
    files.write_text(f"{uri}/a.txt", "x" * 1000)
    files.rmtree(uri)
    assert not files.exists(f"{uri}/a.txt")
    listing = f"http://127.0.0.1:{gcs.port}/storage/v1/b/{gcs.bucket}/o?softDeleted=true&prefix={tmp_path.name}"
    with urllib.request.urlopen(listing, timeout=10) as answer:
        assert json.loads(answer.read()).get("items", []) == []


def test_a_file_another_process_rewrote_longer_is_read_whole(gcs, tmp_path):
    """A live file (the Trainer's progress, a task's log) is rewritten by another host while this process reads it:
    each read gets the whole new file, though TF still holds the old, shorter size for a few seconds."""
    path = f"{gcs.root}/{tmp_path.name}/progress.json"
    rewrite = "import sys, tensorflow as tf; tf.io.gfile.GFile(sys.argv[1], 'w').write(sys.argv[2])"
    subprocess.run([sys.executable, "-c", rewrite, path, '{"step": 1}'], check=True, timeout=120)
    assert json.loads(files.read_text(path)) == {"step": 1}  # TF now holds this size
    longer = json.dumps({"step": 2, "loss_trace": [[1, 0.9], [2, 0.8]]})
    subprocess.run([sys.executable, "-c", rewrite, path, longer], check=True, timeout=120)
    assert files.read_text(path) == longer
    with files.open_file(path) as text, files.open_file(path, "rb") as binary:
        assert text.read() == longer and binary.read() == longer.encode()
    with pytest.raises(FileNotFoundError, match="missing.json"):
        files.read_text(f"{gcs.root}/{tmp_path.name}/missing.json")


def test_a_retried_writer_replaces_the_earlier_attempt_whole(gcs, tmp_path):
    uri = f"{gcs.root}/{tmp_path.name}/out"
    with publishing.publish(uri) as out:
        files.write_text(os.path.join(out, "old-only"), "1")
        files.write_text(os.path.join(out, "v"), "1")
    with pytest.raises(RuntimeError):
        with publishing.publish(uri) as out:
            files.write_text(os.path.join(out, "half"), "x")
            raise RuntimeError("task died")
    assert not files.exists(uri), "a failed attempt removes what it wrote, and the output it was replacing"
    with pytest.raises(SpecError, match="does not exist"):
        artifacts.require_published(uri, "Examples")
    with publishing.publish(uri) as out:
        files.write_text(os.path.join(out, "v"), "22")
    assert _manifest(uri) == {"v": 2}
    assert sorted(_objects(gcs, uri)) == [artifacts.PUBLISHED_FILE, "v"]


def test_an_attempt_taken_over_by_its_retry_neither_publishes_nor_removes_what_the_retry_wrote(gcs, tmp_path):
    """The first attempt's host is cut off and Airflow retries the task elsewhere while it still runs: whether the
    first attempt then fails or finishes, the retry's artifact is the one published, with none of the first's files
    and nothing of the retry's removed."""
    uri = f"{gcs.root}/{tmp_path.name}/out"
    first = publishing.publish(uri)
    files.write_text(os.path.join(first.__enter__(), "first-only"), "1")
    with publishing.publish(uri) as retry:  # the retry starts over, and signs the folder as its own
        files.write_text(os.path.join(retry, "shard"), "22")
        killed = RuntimeError("killed")  # the first attempt is killed (SIGTERM) mid-write; its error goes on
        assert first.__exit__(RuntimeError, killed, killed.__traceback__) is False
        assert _objects(gcs, uri) == {"shard": 2, artifacts.WRITER_FILE: _objects(gcs, uri)[artifacts.WRITER_FILE]}
    assert _manifest(uri) == {"shard": 2}

    again = publishing.publish(uri)
    files.write_text(os.path.join(again.__enter__(), "shard"), "333")
    with publishing.publish(uri) as retry:
        files.write_text(os.path.join(retry, "shard"), "4444")
        with pytest.raises(SpecError, match="taken over by another attempt"):  # the first one finishes its work
            again.__exit__(None, None, None)
    assert _manifest(uri) == {"shard": 4}
    assert sorted(_objects(gcs, uri)) == [artifacts.PUBLISHED_FILE, "shard"]


def test_an_attempt_keeps_its_scratch_beside_the_artifact_and_its_retry_removes_it(gcs, tmp_path):
    """tf.Transform's temporary files go to a scratch folder of the attempt's own beside the artifact: an attempt
    cut off and writing on cannot leave them in the artifact its retry published, and the retry removes the
    scratch folder that attempt left, so that the attempt fails instead of writing on."""
    uri = f"{gcs.root}/{tmp_path.name}/Transform/transform_graph"
    first = publishing.publish(uri)
    first.__enter__()
    stale_scratch = publishing.scratch_space(uri)
    scratch = stale_scratch.__enter__()
    assert not scratch.startswith(uri + "/"), scratch
    files.write_text(f"{scratch}/analyzer_temporary_assets/a", "1")
    with publishing.publish(uri) as retry, publishing.scratch_space(uri) as own:
        assert not list(files.walk_files(scratch)), "the retry removed the scratch folder of the attempt it took over"
        files.write_text(f"{retry}/transform_fn", "22")
        files.write_text(f"{own}/analyzer_temporary_assets/b", "1")
    files.write_text(f"{scratch}/analyzer_temporary_assets/c", "1")  # the cut-off attempt writes on
    assert _objects(gcs, uri) == {artifacts.PUBLISHED_FILE: _objects(gcs, uri)[artifacts.PUBLISHED_FILE],
                                  "transform_fn": 2}
    assert not list(files.walk_files(own)), "an attempt's scratch folder is removed when it ends"
    stale_scratch.__exit__(None, None, None)
    assert files.listdir(f"{gcs.root}/{tmp_path.name}/Transform") == ["transform_graph"]


def test_an_attempt_that_comes_back_after_its_retry_began_leaves_the_retrys_work_alone(gcs, tmp_path):
    """A cut-off Transform attempt that got its network back went on to its next step: it emptied the artifact its
    retry was writing and removed the retry's scratch folder, which failed the retry reading its own vocabularies.
    An attempt knows when it began; one that finds a later attempt's work ends, and removes none of it."""
    uri = f"{gcs.root}/{tmp_path.name}/Transform/transform_graph"
    cut_off_began = time.time()
    with publishing.publish(uri, cut_off_began + 40) as retry, publishing.scratch_space(uri, cut_off_began + 40) as own:
        files.write_text(f"{retry}/transform_fn", "22")
        files.write_text(f"{own}/tftransform_tmp/island", "Biscoe")
        with pytest.raises(SpecError, match="began after this one"):
            with publishing.scratch_space(uri, cut_off_began):
                pass
        with pytest.raises(SpecError, match="began after this one is writing it"):
            with publishing.publish(uri, cut_off_began):
                pass
        assert files.read_text(f"{own}/tftransform_tmp/island") == "Biscoe"
        assert files.read_text(f"{retry}/transform_fn") == "22"
    assert _manifest(uri) == {"transform_fn": 2}
    with publishing.scratch_space(uri, cut_off_began + 80) as later:  # a later attempt still removes earlier ones'
        stale = f"{gcs.root}/{tmp_path.name}/Transform/transform_graph.tmp-scratch-deadbeef"
        files.write_text(f"{stale}/x", "1")
    with publishing.scratch_space(uri, cut_off_began + 90):
        assert not list(files.walk_files(stale)) and not list(files.walk_files(later))


def test_requests_of_a_cut_off_attempt_that_land_late_leave_the_artifact_to_its_retry(gcs, tmp_path):
    """Requests of an attempt whose host was cut off can land once the network is back, after its retry signed the
    artifact: its signature replaced the retry's, and when it then ended (taken over at its next output) it emptied
    the artifact the retry was writing, which failed the retry too (seen on the test hosts). An attempt taken over
    removes nothing; the retry signs again, whether the late request signed or removed the signature, and the
    attempt cut off can write no more."""
    from hpml.components.errors import TakenOver

    uri = f"{gcs.root}/{tmp_path.name}/Transform/transformed_examples"
    cut_off_began = time.time()
    cut_off = publishing.publish(uri, cut_off_began)
    cut_off.__enter__()
    cut_off_fence = publishing.writer_fence(uri)
    late_signature = files.read_text(f"{uri}/{artifacts.WRITER_FILE}")
    with publishing.publish(uri, cut_off_began + 40) as retry:
        fence = publishing.writer_fence(uri)
        files.write_text(f"{retry}/shard-0", "1")
        files.write_text(f"{uri}/{artifacts.WRITER_FILE}", late_signature)  # the cut-off attempt's signature lands
        taken_over = TakenOver("its next output was taken over")
        assert cut_off.__exit__(TakenOver, taken_over, None) is False
        assert files.read_text(f"{retry}/shard-0") == "1", "the attempt taken over removed nothing"
        fence()  # the retry signs again
        with pytest.raises(TakenOver, match="taken over by another attempt"):
            cut_off_fence()
        files.write_text(f"{retry}/shard-1", "22")
        files.remove(f"{uri}/{artifacts.WRITER_FILE}")  # the cut-off attempt's removal of the signature lands
        fence()
        files.write_text(f"{retry}/shard-2", "333")
    assert _manifest(uri) == {"shard-0": 1, "shard-1": 2, "shard-2": 3}
    assert sorted(_objects(gcs, uri)) == [artifacts.PUBLISHED_FILE, "shard-0", "shard-1", "shard-2"]


def test_a_late_removal_of_a_shard_the_retry_wrote_fails_the_retry_and_publishes_nothing(gcs, tmp_path):
    """An attempt empties the artifact as it begins: a removal it sent before its host was cut off can land after its
    retry wrote a shard of the same name (here the second of three). The retry's manifest would list the two left,
    and readers would take two thirds of the split for all of it. The retry fails instead, removes what it wrote and
    publishes nothing; the task's next try publishes the whole series."""
    from hpml.components.errors import HpmlError

    uri = f"{gcs.root}/{tmp_path.name}/ExampleGen/examples"
    shards = [f"Split-train/{artifacts.shard_name(artifacts.EXAMPLES_FILE_PREFIX, i, 3)}" for i in range(3)]
    began = time.time()
    with pytest.raises(HpmlError, match=r"1 shard\(s\) this attempt wrote are gone.*data_tfrecord-00001-of-00003\.gz") \
            as failed:
        with publishing.publish(uri, began + 40) as retry:
            for name in shards:
                files.write_text(f"{retry}/{name}", "x" * 7)
            files.write_text(f"{retry}/schema.pbtxt", "feature {}")
            files.remove(f"{retry}/{shards[1]}")  # the cut-off attempt's held-up removal lands
    assert "next try writes the artifact again" in failed.value.hint
    assert _objects(gcs, uri) == {}, "nothing is left that a reader could take for the artifact"
    with pytest.raises(SpecError, match="examples does not exist"):
        artifacts.require_published(uri, "examples")
    with publishing.publish(uri, began + 80) as next_try:
        for name in shards:
            files.write_text(f"{next_try}/{name}", "x" * 7)
    assert _manifest(uri) == dict.fromkeys(shards, 7)


def test_a_series_of_shards_is_whole_when_every_index_up_to_its_count_is_there():
    names = ["Split-eval/data_tfrecord-00000-of-00001.gz", "variables/variables.data-00000-of-00002",
             "variables/variables.data-00001-of-00002", "Split-train/data_tfrecord-00003-of-00004.gz",
             "Split-train/data_tfrecord-00000-of-00004.gz", "schema.pbtxt", "saved_model.pb"]
    assert artifacts.missing_from_shard_series(names) == ["Split-train/data_tfrecord-00001-of-00004.gz",
                                                          "Split-train/data_tfrecord-00002-of-00004.gz"]
    assert artifacts.missing_from_shard_series(names[:3]) == []


def test_a_gate_that_publishes_after_its_retry_did_ends_and_leaves_the_retrys_blessing(gcs, tmp_path, penguin_outputs,
                                                                                        monkeypatch):
    """Any component, not only Transform: a Gate attempt cut off while it scored, and retried meanwhile, comes back
    to publish after its retry published. Its component run knows when it began: it ends (TakenOver), and the
    retry's blessing stays as the retry published it."""
    from hpml.components.errors import TakenOver
    from hpml.components.gate import GATE, scoring

    uri = f"{gcs.root}/{tmp_path.name}/Gate/blessing"
    inputs = {"examples": penguin_outputs["ExampleGen"]["examples"], "schema": penguin_outputs["ExampleGen"]["schema"],
              "model": penguin_outputs["Trainer"]["model"]}
    params = {"label_key": "species", "thresholds": {"accuracy": 0.0}}
    score, retry_published = scoring.score, []

    def score_then_lose_the_network(*args):
        scored = score(*args)
        if not retry_published:  # while the first attempt is cut off, its retry begins and publishes
            retry_published.append(None)
            time.sleep(0.01)
            GATE.run(inputs, {"blessing": uri}, params)
            retry_published[0] = files.read_text(f"{uri}/{artifacts.PUBLISHED_FILE}")
        return scored

    monkeypatch.setattr(scoring, "score", score_then_lose_the_network)
    with pytest.raises(TakenOver, match="began after this one published it"):
        GATE.run(inputs, {"blessing": uri}, params)
    assert retry_published == [files.read_text(f"{uri}/{artifacts.PUBLISHED_FILE}")], "the retry's, as it published"
    assert sorted(_objects(gcs, uri)) == sorted([artifacts.PUBLISHED_FILE, *_manifest(uri)])
    assert sorted(_manifest(uri)) == [artifacts.BLESSED_FILE, artifacts.GATE_FILE]
    assert publishing.began(uri) is None, "the attempt's start time is the component run's alone"


def test_shards_of_an_attempt_taken_over_are_not_moved_into_the_artifact(gcs, tmp_path, penguin_outputs):
    """Transform's shard writer asks before it moves each shard into the artifact: a Beam pipeline of an attempt
    whose artifact another attempt has since published fails, and moves nothing into it."""
    from hpml.components.beam_utils import make_pipeline, run_pipeline
    from hpml.components.schema_file import read_schema
    from hpml.components.transform import example_io

    uri = f"{gcs.root}/{tmp_path.name}/transformed_examples"
    stale = publishing.publish(uri)
    stale.__enter__()
    fence = publishing.writer_fence(uri)
    fence()  # while the attempt owns the artifact, it may write
    with publishing.publish(uri) as retry:
        files.write_text(f"{retry}/Split-train/transformed_examples-00000-of-00001.gz", "")
    schema = read_schema(artifacts.schema_path(penguin_outputs["ExampleGen"]["schema"]))
    shards = artifacts.require_files(artifacts.examples_file_pattern(penguin_outputs["ExampleGen"]["examples"],
                                                                     "train"), "train")
    pipeline = make_pipeline([])
    _ = (pipeline | example_io.ReadExampleBatches(shards, schema)
         | example_io.WriteExampleShards(f"{uri}/Split-train/transformed_examples", str(tmp_path / "temp"), fence))
    with pytest.raises(Exception, match="taken over by another attempt"):
        run_pipeline(pipeline)
    shard = "Split-train/transformed_examples-00000-of-00001.gz"
    assert sorted(_objects(gcs, uri)) == [shard, artifacts.PUBLISHED_FILE]
    assert _manifest(uri) == {shard: 0}
    assert len(os.listdir(tmp_path / "temp")) >= 1, "the attempt's own files stay in its scratch folder"


def test_a_killed_example_gen_leaves_nothing_the_next_task_reads(gcs, tmp_path, penguin_csv):
    """SIGKILL while Beam is writing the shards: no manifest, so Transform refuses the Examples; the retried task
    publishes them whole, with nothing of the killed attempt left among them."""
    root = f"{gcs.root}/{tmp_path.name}"
    gen = {"examples": f"{root}/examples", "schema": f"{root}/schema"}
    params = {"input_path": penguin_csv}
    code = ("import json, sys; from hpml.components.example_gen import EXAMPLE_GEN; "
            "EXAMPLE_GEN.run({}, json.loads(sys.argv[1]), json.loads(sys.argv[2]))")
    writer = subprocess.Popen([sys.executable, "-c", code, json.dumps(gen), json.dumps(params)],
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while True:  # until Beam's temporary shards are being written under the artifact
            written = [name for name in _objects(gcs, gen["examples"]) if "Split-" in name]
            if written:
                break
            assert writer.poll() is None, "the writer ended before it could be killed"
            assert time.monotonic() < deadline, "the writer wrote no shard in 120 s"
            time.sleep(0.05)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    left = _objects(gcs, gen["examples"])
    assert left and artifacts.PUBLISHED_FILE not in left, "the killed attempt left part of its output, unpublished"
    transform = {key: f"{root}/{key}" for key in ("transform_graph", "transformed_examples", "input_pipeline")}
    with pytest.raises(SpecError, match=f"has no {artifacts.PUBLISHED_FILE}.*did not finish"):
        TRANSFORM.run(gen, transform, {"module": "hpml.examples.penguin.module"})
    assert not _objects(gcs, root + "/transform_graph"), "the refused task wrote nothing"

    EXAMPLE_GEN.run({}, gen, params)  # the retry
    manifest = _manifest(gen["examples"])
    stored = {name: size for name, size in _objects(gcs, gen["examples"]).items() if name != artifacts.PUBLISHED_FILE}
    assert stored == manifest, "every object under the artifact is one the retry wrote and listed"
    assert any(name.startswith("Split-train/data_tfrecord-") for name in manifest)
    shards = artifacts.require_files(artifacts.examples_file_pattern(gen["examples"], "train"), "Examples")
    assert sum(1 for _ in tf.data.TFRecordDataset(shards, compression_type="GZIP")) > 100


def _records(uri: str, split: str) -> list[bytes]:
    shards = artifacts.require_files(artifacts.examples_file_pattern(uri, split), "Examples")
    return sorted(r.numpy() for r in tf.data.TFRecordDataset(shards, compression_type="GZIP"))


def test_example_gen_reads_csv_from_the_object_store_as_from_local_disk(gcs, tmp_path, penguin_csv):
    import gzip

    data = f"{gcs.root}/{tmp_path.name}/data"
    raw = open(penguin_csv, "rb").read()
    with tf.io.gfile.GFile(f"{data}/part-0.csv.gz", "wb") as handle:  # a compressed part, as Spark writes them
        handle.write(gzip.compress(raw))
    with tf.io.gfile.GFile(f"{data}/_SUCCESS", "wb") as handle:
        handle.write(b"")
    local = {"examples": str(tmp_path / "examples"), "schema": str(tmp_path / "schema")}
    remote = {"examples": f"{gcs.root}/{tmp_path.name}/examples", "schema": f"{gcs.root}/{tmp_path.name}/schema"}
    EXAMPLE_GEN.run({}, local, {"input_path": penguin_csv})
    EXAMPLE_GEN.run({}, remote, {"input_path": data})  # the folder: its _SUCCESS marker is not data
    for split in ("train", "eval"):
        assert _records(remote["examples"], split) == _records(local["examples"], split)
    assert files.read_text(f"{remote['schema']}/schema.pbtxt") == open(f"{local['schema']}/schema.pbtxt").read()


def test_data_paths_on_an_object_store_are_confined_to_the_configured_prefixes(monkeypatch):
    from hpml.pipelines.paths import confine

    monkeypatch.setenv("HPML_DATA_ROOTS", f"/srv/data{os.pathsep}gs://team-bucket/data")
    assert confine("gs://team-bucket/data/penguins.csv", "input_path") == "gs://team-bucket/data/penguins.csv"
    for outside in ("gs://team-bucket/database.csv", "gs://team-bucket/data/../secrets.csv", "gs://other/data/x"):
        with pytest.raises(SpecError, match="outside the allowed data roots"):
            confine(outside, "input_path")


def test_a_large_csv_on_the_object_store_is_read_as_pieces_like_local_disk(gcs, tmp_path, monkeypatch):
    """Pieces after the first start at a byte offset: the reader seeks there on the object store too."""
    from hpml.components.example_gen import csv_chunks

    kinds = ["line", '"two\nlines"', "line"]  # a quoted newline every third row
    rows = [f'{i},{i * 0.5},"note, {i % 7}",{kinds[i % 3]}' for i in range(3000)]
    text = "id,value,note,kind\n" + "\n".join(rows) + "\n"
    local_csv = tmp_path / "big.csv"
    local_csv.write_text(text)
    remote_csv = f"{gcs.root}/{tmp_path.name}/big.csv"
    with tf.io.gfile.GFile(remote_csv, "w") as handle:
        handle.write(text)
    monkeypatch.setattr(csv_chunks, "PIECE_BYTES", 16 << 10)
    pieces = csv_chunks.plan_pieces(remote_csv, "utf-8")
    assert len(pieces) >= 3 and pieces == [csv_chunks.Piece(remote_csv, p.start, p.end)
                                           for p in csv_chunks.plan_pieces(str(local_csv), "utf-8")]
    local = {"examples": str(tmp_path / "examples"), "schema": str(tmp_path / "schema")}
    remote = {"examples": f"{gcs.root}/{tmp_path.name}/examples", "schema": f"{gcs.root}/{tmp_path.name}/schema"}
    EXAMPLE_GEN.run({}, local, {"input_path": str(local_csv)})
    EXAMPLE_GEN.run({}, remote, {"input_path": remote_csv})
    for split in ("train", "eval"):
        assert _records(remote["examples"], split) == _records(local["examples"], split)
    assert sum(len(_records(local["examples"], split)) for split in ("train", "eval")) == 3000


@pytest.mark.parametrize("where", ["gs", "local"])
def test_a_folder_walk_skips_a_file_a_concurrent_writer_removes_after_the_listing(gcs, tmp_path, monkeypatch, where):
    """A writer's temporary file can go between the listing of its folder and the size lookup (a reader waiting for
    an artifact walks it while the writer renames): the walk lists what is still there instead of failing."""
    root = f"{gcs.root}/{tmp_path.name}/walked" if where == "gs" else str(tmp_path / "walked")
    files.makedirs(os.path.join(root, "metadata"))
    files.write_text(os.path.join(root, "metadata", "schema.pbtxt"), "feature {}")
    files.write_text(os.path.join(root, "metadata", "schema.pbtxt.tmp0f9e"), "feature {}")
    real_walk = tf.io.gfile.walk if where == "gs" else os.walk

    def walk_then_remove(top, *args, **kwargs):
        for folder, subfolders, names in real_walk(top, *args, **kwargs):
            if "schema.pbtxt.tmp0f9e" in names:  # listed; now the writer removes it before anyone asks its size
                files.remove(os.path.join(folder, "schema.pbtxt.tmp0f9e"))
            yield folder, subfolders, names

    monkeypatch.setattr(tf.io.gfile if where == "gs" else os, "walk", walk_then_remove)
    assert list(files.walk_files(root)) == [("metadata/schema.pbtxt", 10)]
