"""Atomic publishing, the TFX naming rules for artifacts, and the size record of their shards."""
import os

import pytest

from hpml.components import artifacts, publishing
from hpml.components.errors import InputDataError, SpecError


def test_publish_renames_into_place_only_on_success(tmp_path):
    target = tmp_path / "Component" / "out"
    with publishing.publish(str(target)) as tmp:
        assert not target.exists(), "output must not be visible while it is being written"
        (open(os.path.join(tmp, "f"), "w")).write("done")
    assert (target / "f").read_text() == "done"
    assert os.listdir(tmp_path / "Component") == ["out"]


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with publishing.publish(str(target)) as tmp:
            open(os.path.join(tmp, "half"), "w").write("x")
            raise RuntimeError("task died")
    assert os.listdir(tmp_path) == []


def test_retry_clears_stale_temporaries_and_replaces_previous_output(tmp_path):
    target = tmp_path / "out"
    stale = tmp_path / "out.tmp-deadbeef0000"
    stale.mkdir()
    (stale / "half").write_text("left by a killed task")
    with publishing.publish(str(target)) as tmp:
        open(os.path.join(tmp, "v"), "w").write("1")
    with publishing.publish(str(target)) as tmp:
        open(os.path.join(tmp, "v"), "w").write("2")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert (target / "v").read_text() == "2"


@pytest.mark.parametrize("name", ["train", "eval", "Split_2", "a-b", "0"])
def test_valid_split_names(name):
    assert artifacts.split_dir("/x", name) == f"/x/Split-{name}"


@pytest.mark.parametrize("name", ["", "-x", "_x", "a/b", "a b", "ünï"])
def test_invalid_split_names_are_refused(name):
    with pytest.raises(SpecError, match="split name"):
        artifacts.split_dir("/x", name)


def _published_shards(tmp_path, sizes=(300, 200, 100)):
    """An artifact published with its size record: Split-train/part-{i}.gz of the given sizes."""
    uri = str(tmp_path / "Examples")
    with publishing.publish(uri) as tmp:
        os.makedirs(os.path.join(tmp, "Split-train"))
        for index, size in enumerate(sizes):
            with open(os.path.join(tmp, "Split-train", f"part-{index}.gz"), "wb") as handle:
                handle.write(bytes(range(256)) * (size // 256) + bytes(size % 256))
        assert artifacts.record_shard_sizes(tmp) == {f"Split-train/part-{i}.gz": s for i, s in enumerate(sizes)}
    return uri, os.path.join(uri, "Split-train", "part-*.gz")


def test_a_published_split_reads_back_whole(tmp_path):
    _, pattern = _published_shards(tmp_path)
    assert [os.path.basename(f) for f in artifacts.require_files(pattern, "Examples")] == \
        ["part-0.gz", "part-1.gz", "part-2.gz"]


def test_a_shard_cut_after_publishing_is_named_with_both_sizes(tmp_path):
    uri, pattern = _published_shards(tmp_path)
    victim = os.path.join(uri, "Split-train", "part-1.gz")
    with open(victim, "r+b") as handle:
        handle.truncate(192)
    with pytest.raises(InputDataError, match="Examples: shard.s. not as their writer left them") as caught:
        artifacts.require_files(pattern, "Examples")
    message = str(caught.value)
    assert f"{victim}: 192 bytes, but {uri}/shard_sizes.json records 200 as written" in message
    assert "part-0" not in message and "part-2" not in message
    assert "re-run the component that wrote it" in caught.value.hint and "delete shard_sizes.json" in caught.value.hint


def test_a_shard_gone_after_publishing_is_named_as_missing(tmp_path):
    uri, pattern = _published_shards(tmp_path)
    os.remove(os.path.join(uri, "Split-train", "part-2.gz"))
    with pytest.raises(InputDataError, match="part-2.gz: missing; .*shard_sizes.json lists it"):
        artifacts.require_files(pattern, "Examples")
    # A pattern that never asked for that shard is not short of it.
    assert len(artifacts.require_files(os.path.join(uri, "Split-train", "part-[01].gz"), "Examples")) == 2


def test_shards_without_a_record_are_left_to_their_reader(tmp_path):
    uri, pattern = _published_shards(tmp_path)
    os.remove(os.path.join(uri, artifacts.SHARD_SIZES_FILE))
    os.truncate(os.path.join(uri, "Split-train", "part-1.gz"), 10)
    assert artifacts.recorded_shard_sizes(artifacts.require_files(pattern, "Examples")) == {}
    with open(os.path.join(uri, artifacts.SHARD_SIZES_FILE), "w") as handle:
        handle.write('{"shards": {"Split-train/part-0.gz": 30')  # a record cut short vouches for nothing
    assert artifacts.recorded_shard_sizes(artifacts.require_files(pattern, "Examples")) == {}
