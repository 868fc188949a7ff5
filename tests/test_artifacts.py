"""Atomic publishing and the TFX naming rules for artifacts."""
import os

import pytest

from components import artifacts
from components.errors import SpecError


def test_publish_renames_into_place_only_on_success(tmp_path):
    target = tmp_path / "Component" / "out"
    with artifacts.publish(str(target)) as tmp:
        assert not target.exists(), "output must not be visible while it is being written"
        (open(os.path.join(tmp, "f"), "w")).write("done")
    assert (target / "f").read_text() == "done"
    assert os.listdir(tmp_path / "Component") == ["out"]


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with artifacts.publish(str(target)) as tmp:
            open(os.path.join(tmp, "half"), "w").write("x")
            raise RuntimeError("task died")
    assert os.listdir(tmp_path) == []


def test_retry_clears_stale_temporaries_and_replaces_previous_output(tmp_path):
    target = tmp_path / "out"
    stale = tmp_path / "out.tmp-deadbeef0000"
    stale.mkdir()
    (stale / "half").write_text("left by a killed task")
    with artifacts.publish(str(target)) as tmp:
        open(os.path.join(tmp, "v"), "w").write("1")
    with artifacts.publish(str(target)) as tmp:
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
