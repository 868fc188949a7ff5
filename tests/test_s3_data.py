"""Data on s3:// (moto's S3 server on loopback): ExampleGen reads CSV there as it reads it from local disk."""
import contextlib
import gzip
import os
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from hpml.components import artifacts, files, publishing, s3_files
from hpml.components.errors import InputDataError, SpecError
from hpml.components.example_gen import EXAMPLE_GEN


def _records(uri: str, split: str) -> list[bytes]:
    shards = artifacts.require_files(artifacts.examples_file_pattern(uri, split), "Examples")
    return sorted(r.numpy() for r in tf.data.TFRecordDataset(shards, compression_type="GZIP"))


def _same_examples(tmp_path, local_input: str, remote_input: str, **params) -> None:
    local = {"examples": str(tmp_path / "local" / "examples"), "schema": str(tmp_path / "local" / "schema")}
    remote = {"examples": str(tmp_path / "remote" / "examples"), "schema": str(tmp_path / "remote" / "schema")}
    EXAMPLE_GEN.run({}, local, {"input_path": local_input, **params})
    EXAMPLE_GEN.run({}, remote, {"input_path": remote_input, **params})
    for split in ("train", "eval"):
        assert _records(remote["examples"], split) == _records(local["examples"], split)
    assert files.read_text(f"{remote['schema']}/schema.pbtxt") == files.read_text(f"{local['schema']}/schema.pbtxt")


def test_example_gen_reads_a_csv_folder_on_s3_as_from_local_disk(s3, tmp_path, penguin_csv):
    data = f"{s3.root}/{tmp_path.name}/data"
    raw = open(penguin_csv, "rb").read()
    files.write_text(f"{data}/_SUCCESS", "")  # a Spark job's marker: not data
    with files.open_file(f"{data}/part-0.csv.gz", "wb") as handle:  # a compressed part, as Spark writes them
        handle.write(gzip.compress(raw))
    _same_examples(tmp_path, penguin_csv, data)


def test_a_large_csv_on_s3_is_read_as_pieces_like_local_disk(s3, tmp_path, monkeypatch):
    """Pieces after the first start at a byte offset: a ranged read there, not a download of what comes before."""
    from hpml.components.example_gen import csv_chunks

    kinds = ["line", '"two\nlines"', "line"]  # a quoted newline every third row
    rows = [f'{i},{i * 0.5},"note, {i % 7}",{kinds[i % 3]}' for i in range(3000)]
    text = "id,value,note,kind\n" + "\n".join(rows) + "\n"
    local_csv = tmp_path / "big.csv"
    local_csv.write_text(text)
    remote_csv = f"{s3.root}/{tmp_path.name}/big.csv"
    files.write_text(remote_csv, text)
    monkeypatch.setattr(csv_chunks, "PIECE_BYTES", 16 << 10)
    pieces = csv_chunks.plan_pieces(remote_csv, "utf-8")
    assert len(pieces) >= 3 and pieces == [csv_chunks.Piece(remote_csv, p.start, p.end)
                                           for p in csv_chunks.plan_pieces(str(local_csv), "utf-8")]
    _same_examples(tmp_path, str(local_csv), remote_csv)


def test_hpml_init_and_hpml_run_on_a_csv_on_s3(s3, tmp_path):
    """A user's flow with the data in a bucket: init reads the CSV there, and the pipeline it writes trains on it."""
    from tests.test_init import _hpml, _species_csv

    work = tmp_path / "work"
    work.mkdir()
    data = f"{s3.root}/{tmp_path.name}/data/species.csv"
    files.copy_file(_species_csv(tmp_path / "species.csv"), data)
    done = _hpml("init", "species", "--csv", data, "--label", "kind", cwd=work)
    assert done.returncode == 0, done.stderr
    assert "species: classification of 'kind' (2 classes) from 1 numeric and 1 text column(s), 240 rows" in done.stdout
    assert f"DATA = {data!r}" in (work / "species" / "pipeline.py").read_text()
    run = _hpml("run", "species", "--param", "epochs=8", "--param", "learning_rate=0.05", cwd=work,
                HPML_DATA_ROOTS=f"{s3.root}/{tmp_path.name}/data", HPML_HOME=str(tmp_path / "home"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "examples: train=" in run.stdout
    accuracy = float(next(line for line in run.stdout.splitlines() if line.startswith("eval: "))
                     .split("accuracy=")[1].split()[0])
    assert accuracy > 0.85, run.stdout

    missing = f"{s3.root}/{tmp_path.name}/data/nothing.csv"
    refused = _hpml("init", "other", "--csv", missing, "--label", "kind", cwd=work)
    assert refused.returncode != 0 and f"{missing}: no such file" in refused.stderr


def test_tfrecord_input_on_s3_is_read_through_the_local_cache_like_local_files(s3, tmp_path, penguin_csv,
                                                                               monkeypatch):
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    first = {"examples": str(tmp_path / "first" / "examples"), "schema": str(tmp_path / "first" / "schema")}
    EXAMPLE_GEN.run({}, first, {"input_path": penguin_csv})
    remote = f"{s3.root}/{tmp_path.name}/tfrecords"
    files.copy_tree(first["examples"], remote)
    _same_examples(tmp_path, first["examples"] + "/Split-*/*.gz", remote + "/Split-*/*.gz", input_format="tfrecord")
    cached = sorted(os.listdir(tmp_path / "cache" / "s3"))
    assert len(cached) == 2, cached  # one copy per shard, kept for the next reader

    # A shard cut short in an upload is named by its URL.
    shard = files.glob(remote + "/Split-train/*.gz")[0]
    data = s3_files.read_bytes(shard)
    s3_files.write_bytes(f"{remote}-cut/part.gz", data[:-4])
    with pytest.raises(InputDataError, match=rf"^{remote}-cut/part\.gz: corrupted GZIP data after record \d+"):
        EXAMPLE_GEN.run({}, {"examples": str(tmp_path / "cut" / "examples"), "schema": str(tmp_path / "cut" / "s")},
                        {"input_path": f"{remote}-cut/part.gz", "input_format": "tfrecord"})


def test_the_cache_reuses_an_unchanged_object_and_stays_within_its_budget(s3, tmp_path, monkeypatch):
    from hpml.components import s3_cache

    cache = tmp_path / "cache" / "s3"
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HPML_CACHE_BYTES", str(2500))
    root = f"{s3.root}/{tmp_path.name}"
    for name in "abc":
        s3_files.write_bytes(f"{root}/{name}.bin", name.encode() * 1000)

    a = files.tf_readable(f"{root}/a.bin")
    assert open(a, "rb").read() == b"a" * 1000
    inode = os.stat(a).st_ino
    assert files.tf_readable(f"{root}/a.bin") == a and os.stat(a).st_ino == inode, "an unchanged object is reused"

    s3_files.write_bytes(f"{root}/a.bin", b"A" * 1000)  # changed: a new ETag, a new copy
    changed = files.tf_readable(f"{root}/a.bin")
    assert changed != a and open(changed, "rb").read() == b"A" * 1000

    b = files.tf_readable(f"{root}/b.bin")  # 3000 bytes would exceed 2500: the least recently used copy goes
    assert not os.path.exists(a) and os.path.exists(changed) and os.path.exists(b)
    os.utime(changed)
    files.tf_readable(f"{root}/c.bin")
    assert sorted(os.listdir(cache)) == sorted(os.path.basename(p) for p in (changed, files.tf_readable(
        f"{root}/c.bin"))), "b was the least recently used"
    assert sum(os.path.getsize(cache / name) for name in os.listdir(cache)) <= 2500

    s3_files.write_bytes(f"{root}/big.bin", b"x" * 3000)
    with pytest.raises(SpecError, match="does not fit the local cache's budget of 2500 bytes") as err:
        files.tf_readable(f"{root}/big.bin")
    assert "HPML_CACHE_BYTES" in err.value.hint
    with pytest.raises(FileNotFoundError):
        files.tf_readable(f"{root}/missing.bin")
    assert s3_cache.folder() == str(cache)


def test_a_beam_runner_on_other_machines_is_refused_for_artifacts_on_s3(s3, tmp_path, penguin_csv, monkeypatch):
    """The component runs on this machine's local copies of s3:// artifacts: a cluster runner's workers would find
    none of them. The deployment's runner is refused as well as a pipeline's own."""
    root = f"{s3.root}/{tmp_path.name}"
    outputs = {"examples": f"{root}/examples", "schema": f"{root}/schema"}
    with pytest.raises(SpecError, match="Beam runner PortableRunner runs workers on other machines") as err:
        EXAMPLE_GEN.run({}, outputs, {"input_path": penguin_csv,
                                      "beam_pipeline_args": ["--runner=PortableRunner", "--job_endpoint=127.0.0.1:9"]})
    assert "HPML_BEAM_PIPELINE_ARGS" in err.value.hint
    monkeypatch.setenv("HPML_BEAM_PIPELINE_ARGS", "--runner=DataflowRunner --project=p --region=r")
    with pytest.raises(SpecError, match="Beam runner DataflowRunner runs workers on other machines"):
        EXAMPLE_GEN.run({}, outputs, {"input_path": penguin_csv})
    assert not files.exists(root), "nothing was uploaded"
    monkeypatch.delenv("HPML_BEAM_PIPELINE_ARGS")
    EXAMPLE_GEN.run({}, outputs, {"input_path": penguin_csv,
                                  "beam_pipeline_args": ["--direct_running_mode=multi_processing",
                                                         "--direct_num_workers=2"]})  # this machine's processes
    assert files.isfile(f"{outputs['examples']}/{artifacts.PUBLISHED_FILE}")


def test_readers_that_evict_each_others_copies_at_once_all_get_whole_files(s3, tmp_path, monkeypatch):
    """Several readers (tasks on one machine share the cache) filling a cache too small for them all: each removes
    the others' least recently used copies while they list and download. None fails on a copy that another removed
    under it, and each gets its object's bytes."""
    import threading

    from hpml.components import s3_cache

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HPML_CACHE_BYTES", str(4000))
    root = f"{s3.root}/{tmp_path.name}"
    names = [f"{reader}-{i}" for reader in range(6) for i in range(12)]
    for name in names:
        s3_files.write_bytes(f"{root}/{name}.bin", name.encode().ljust(1000, b"."))
    start, errors = threading.Barrier(6), []

    def reader(index: int):
        start.wait()
        try:
            for i in range(12):
                name = f"{index}-{i}"
                path = s3_cache.local_file(f"{root}/{name}.bin")
                with contextlib.suppress(FileNotFoundError):  # removed by another reader since: a reader that
                    with open(path, "rb") as handle:         # opened it first keeps reading it
                        assert handle.read() == name.encode().ljust(1000, b".")
        except Exception as err:  # noqa: BLE001 - every reader's failure is reported
            errors.append(f"reader {index}: {err!r}")

    threads = [threading.Thread(target=reader, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    kept = os.listdir(tmp_path / "cache" / "s3")
    assert sum(os.path.getsize(tmp_path / "cache" / "s3" / name) for name in kept) <= 4000 + 6 * 1000, kept


HOLD_A_COPY = """
import sys
from hpml.components import s3_cache
with s3_cache.held_tree(sys.argv[1]) as path:
    print(path, flush=True)
    sys.stdin.read()  # until the test closes stdin
"""

STAGE_AN_OUTPUT = """
import os, sys
from hpml.components import staging
with staging.staged({}, {"out": sys.argv[1]}) as (_, outputs):
    os.makedirs(outputs["out"])
    open(os.path.join(outputs["out"], "part"), "w").write("written")
    print(outputs["out"], flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


def _task(script: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A task in a process of its own, and the path it printed once it holds what it works on."""
    task = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    return task, task.stdout.readline().strip()


def test_a_copy_a_running_task_holds_is_not_evicted_until_the_task_ends(s3, tmp_path, monkeypatch, caplog):
    """Tasks on one machine share the cache: another task's download passes over the copy a running task works on
    (the cache goes over its budget for it, with a warning) and evicts it once that task has ended."""
    from hpml.components import s3_cache

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HPML_CACHE_BYTES", "2500")
    root = f"{s3.root}/{tmp_path.name}"
    for name in "xyzw":
        s3_files.write_bytes(f"{root}/{name}/part", name.encode() * 1000)
    task, held = _task(HOLD_A_COPY, f"{root}/x")
    try:
        assert open(os.path.join(held, "part"), "rb").read() == b"x" * 1000
        y = s3_cache.local_tree(f"{root}/y")
        z = s3_cache.local_tree(f"{root}/z")  # x, the least recently used, is held: y goes instead
        assert os.path.isdir(held) and not os.path.exists(y) and os.path.isdir(z)
        monkeypatch.setenv("HPML_CACHE_BYTES", "1500")
        y = s3_cache.local_tree(f"{root}/y")  # z goes; only x could make the rest of the room
        assert os.path.isdir(held) and os.path.isdir(y) and not os.path.exists(z)
        assert "goes over its budget of 1500 bytes: 1000 bytes of its copies are in use" in caplog.text
    finally:
        task.stdin.close()
        assert task.wait(timeout=60) == 0
    w = s3_cache.local_tree(f"{root}/w")  # x is held no more: it goes, then y
    assert os.listdir(tmp_path / "cache" / "s3") == [os.path.basename(w)]


def _kill_and_age(task, folders: list[str]) -> None:
    """SIGKILL `task`, then make `folders` older than the minute a task may take to hold a folder it just made."""
    task.kill()
    task.wait(timeout=60)
    for folder in folders:
        os.utime(folder, (time.time() - 120, time.time() - 120))


def test_output_folders_that_killed_tasks_left_are_removed_by_the_next_and_live_ones_stay(s3, tmp_path,
                                                                                           monkeypatch):
    """A task killed while its executor ran leaves its local output folder: the next task on the machine removes
    it. A live task's folder stays, and that task still publishes its output."""
    from hpml.components import staging

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    root = f"{s3.root}/{tmp_path.name}"
    killed, killed_out = _task(STAGE_AN_OUTPUT, f"{root}/killed")
    live, live_out = _task(STAGE_AN_OUTPUT, f"{root}/live")
    try:
        _kill_and_age(killed, [os.path.dirname(killed_out), os.path.dirname(live_out)])
        with staging.staged({}, {"out": f"{root}/next"}) as (_, outputs):
            os.makedirs(outputs["out"])
            assert set(os.listdir(tmp_path / "cache" / "s3-staging")) == {
                os.path.basename(os.path.dirname(path)) for path in (live_out, outputs["out"])}
        assert not os.path.exists(killed_out) and os.path.isfile(os.path.join(live_out, "part"))
    finally:
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert files.read_text(f"{root}/live/part") == "written"
    assert files.isfile(f"{root}/live/{artifacts.PUBLISHED_FILE}")
    # The killed task published nothing: on the store it left only its signature as the output's writer.
    assert [name for name, _ in files.walk_files(f"{root}/killed")] == [artifacts.WRITER_FILE]
    assert os.listdir(tmp_path / "cache" / "s3-staging") == []


def _stage_one_file(uri: str, text: str) -> None:
    from hpml.components import staging

    with staging.staged({}, {"out": uri}) as (_, outputs):
        os.makedirs(outputs["out"])
        open(os.path.join(outputs["out"], "part"), "w").write(text)


def test_an_attempt_that_ends_after_its_retry_leaves_the_retrys_artifact_whole(s3, tmp_path, monkeypatch):
    """An attempt cut off from the store while its executor ran, whose retry (begun later) published first, then
    reached its own upload: it emptied the published artifact before anything checked who wrote it. It now fails
    and leaves the retry's artifact as it was, published or mid-upload; a run begun after either still replaces it."""
    import threading

    from hpml.components import staging

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"{s3.root}/{tmp_path.name}/out"
    with pytest.raises(SpecError, match="an attempt of this task that began after this one published it"):
        with staging.staged({}, {"out": uri}) as (_, outputs):
            os.makedirs(outputs["out"])
            open(os.path.join(outputs["out"], "part"), "w").write("stale")
            time.sleep(0.01)
            retry = threading.Thread(target=_stage_one_file, args=(uri, "retry"))  # staging's state is per thread
            retry.start()
            retry.join(timeout=60)
    assert files.read_text(f"{uri}/part") == "retry"
    assert sorted(name for name, _ in files.walk_files(uri)) == [artifacts.PUBLISHED_FILE, "part"]

    with contextlib.ExitStack() as uploading:
        with pytest.raises(SpecError, match="an attempt of this task that began after this one is writing it"):
            with staging.staged({}, {"out": uri}) as (_, outputs):
                os.makedirs(outputs["out"])
                open(os.path.join(outputs["out"], "part"), "w").write("stale")
                time.sleep(0.01)
                target = uploading.enter_context(publishing.publish(uri, started_at=time.time()))
                files.write_text(f"{target}/part", "retry, mid-upload")
        assert files.read_text(f"{uri}/part") == "retry, mid-upload"
    assert files.read_text(f"{uri}/part") == "retry, mid-upload" and files.isfile(f"{uri}/{artifacts.PUBLISHED_FILE}")

    _stage_one_file(uri, "a run begun after both")
    assert files.read_text(f"{uri}/part") == "a run begun after both"


CLAIM_A_WORKING_DIR = """
import os, sys
from hpml.components.trainer import backup_mirror
with backup_mirror.claimed(sys.argv[1]):
    local = backup_mirror.local_working_dir(sys.argv[1])
    open(os.path.join(local, "checkpoint"), "w").write("a backup")
    print(local, flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


def test_the_local_working_folder_of_a_killed_trainer_is_removed_by_the_next_and_a_live_ones_stays(s3, tmp_path,
                                                                                                  monkeypatch):
    """A Trainer whose working dir is on s3:// keeps its backups in a local folder too; one killed (its task lost,
    or retried on another machine) leaves it: the next Trainer on the machine removes it, not a live one's."""
    from hpml.components.trainer import backup_mirror

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    root = f"{s3.root}/{tmp_path.name}"
    killed, killed_dir = _task(CLAIM_A_WORKING_DIR, f"{root}/killed.work")
    live, live_dir = _task(CLAIM_A_WORKING_DIR, f"{root}/live.work")
    try:
        _kill_and_age(killed, [killed_dir, live_dir])
        with backup_mirror.claimed(f"{root}/next.work"):
            mine = backup_mirror.local_working_dir(f"{root}/next.work")
            assert os.path.isdir(mine) and os.path.isdir(live_dir) and not os.path.exists(killed_dir)
        assert os.path.isfile(os.path.join(live_dir, "checkpoint"))
    finally:
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert backup_mirror.local_working_dir(str(tmp_path / "local.work")) == str(tmp_path / "local.work")


def _checkpoint(folder: str, step: int) -> None:
    """A stand-in for what BackupAndRestore writes: a checkpoint's two files, then the index naming it."""
    os.makedirs(folder, exist_ok=True)
    for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"):
        open(os.path.join(folder, name), "w").write(f"{name} " * 1000)
    open(os.path.join(folder, "checkpoint"), "w").write(f'model_checkpoint_path: "ckpt-{step}"\n')


def test_tasks_of_a_job_restore_the_store_s_backup_once_per_machine_and_again_once_it_moves_on(s3, tmp_path,
                                                                                               monkeypatch):
    """Each task of a job submitted again restores the store's backup on its own machine: the first of a machine's
    tasks downloads it, the others find it there, and a newer backup in the store, or a local checkpoint the store
    does not hold, makes it download again."""
    import concurrent.futures

    from hpml.components.trainer import backup_mirror

    work = f"{s3.root}/{tmp_path.name}/model.work"
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "chief-machine"))
    local = os.path.join(backup_mirror.local_working_dir(work), "backup")
    _checkpoint(os.path.join(local, "chief"), 5)
    backup_mirror.upload(work, "backup", "chief")

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "other-machine"))
    other = os.path.join(backup_mirror.local_working_dir(work), "backup")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two tasks on one machine, at once
        copied = sorted(pool.map(lambda _: backup_mirror.restore(work, "backup"), range(2)))
    assert copied[0] == 0 and copied[1] > 0, copied
    assert sorted(os.listdir(os.path.join(other, "chief"))) == ["checkpoint", "ckpt-5.data-00000-of-00001",
                                                                "ckpt-5.index"]
    os.makedirs(os.path.join(other, "workertemp_1"))  # what a task that began training writes beside it
    assert backup_mirror.restore(work, "backup") == 0 and os.path.isdir(os.path.join(other, "workertemp_1"))
    _checkpoint(os.path.join(other, "workertemp_1"), 7)  # a checkpoint the store never got: no task resumes from it
    assert backup_mirror.restore(work, "backup") > 0 and os.listdir(other) == ["chief"]

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "chief-machine"))
    _checkpoint(os.path.join(local, "chief"), 10)
    backup_mirror.upload(work, "backup", "chief")
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "other-machine"))
    assert backup_mirror.restore(work, "backup") > 0
    assert sorted(os.listdir(os.path.join(other, "chief"))) == ["checkpoint", "ckpt-10.data-00000-of-00001",
                                                                "ckpt-10.index"]
