"""components/files.py's writes: a file is replaced whole or not at all, and several files land all or none."""
import os
import threading

import pytest

from hpml.components import files


def _siblings(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_mix(tmp_path):
    path = str(tmp_path / "progress.json")
    texts = ["a" * 2_000_000, "b" * 3_000_000]
    files.write_text(path, texts[0])
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            text = files.read_text(path)
            seen.add((text[:1], len(text)))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            files.write_text(path, texts[i % 2])
    finally:
        stop.set()
        reader.join()
    assert seen <= {("a", 2_000_000), ("b", 3_000_000)}, seen
    assert _siblings(tmp_path) == ["progress.json"], "no temporary file is left beside it"


def test_a_write_that_fails_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = str(tmp_path / "tuned_step.json")
    files.write_text(path, "old")
    with pytest.raises(UnicodeEncodeError):
        files.write_text(path, "new \udc80")  # a lone surrogate cannot be written as UTF-8
    assert files.read_text(path) == "old"
    assert _siblings(tmp_path) == ["tuned_step.json"]


def test_several_files_land_all_or_none(tmp_path):
    (tmp_path / "blocked").write_text("a file where a folder is needed")
    wanted = {tmp_path / "p" / "pipeline.py": "x = 1\n", tmp_path / "p" / "module.py": "y = 2\n",
              tmp_path / "blocked" / "dag.py": "z = 3\n"}
    with pytest.raises(OSError):
        files.write_texts(wanted)
    assert _siblings(tmp_path / "p") == [], "neither the files before the failure nor their temporaries"

    del wanted[tmp_path / "blocked" / "dag.py"]
    files.write_texts(wanted)
    assert {path.name: path.read_text() for path in (tmp_path / "p").iterdir()} == \
        {"pipeline.py": "x = 1\n", "module.py": "y = 2\n"}
