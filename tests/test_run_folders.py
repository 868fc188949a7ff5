"""Run folders: each run id has a folder of its own, and a run never writes into a folder another run id owns."""
import itertools
import os
import random
import re
import string

import pytest

from hpml.components.errors import SpecError
from hpml.pipelines.paths import RUN_OWNER_FILE, run_folder_name

# Every character Airflow accepts in a run id (`[scheduler] allowed_run_id_pattern`), and more that a local run
# id or another engine's may hold.
AIRFLOW_CHARS = string.ascii_letters + string.digits + "_.~:+-"
OTHER_CHARS = " /\\%@<>\"'\n\t\x00é中😀"


def _decode(name: str) -> str:
    """The run id a folder name stands for, read back left to right: proof that the mapping loses nothing."""
    if name == "~":
        return ""
    out, index = bytearray(), 0
    while index < len(name):
        if name[index] == "~":
            out.append(int(name[index + 1:index + 3], 16))
            index += 3
        else:
            out += name[index].encode()
            index += 1
    return out.decode("utf-8", "surrogatepass")


def _ids() -> list[str]:
    rng = random.Random(66)
    ids = {"", ".", "..", "...", "~", "~7E", "sec~col", "sec_col", "sec:col", "sec+col",
           "scheduled__2026-01-01T00:00:00+00:00", "scheduled__2026-01-01T00_00_00_00_00",
           "manual__2026-11-27T10:00:00.123456+00:00", ".hidden", "a.",
           "@BODY@<b>", "x" * 250, ":" * 250, "😀" * 250}
    # Every id of up to four characters over a small alphabet that holds each kind of character.
    for length in range(5):
        ids.update("".join(chars) for chars in itertools.product("a_.~:", repeat=length))
    for _ in range(20000):
        alphabet = AIRFLOW_CHARS if rng.random() < 0.8 else AIRFLOW_CHARS + OTHER_CHARS
        ids.add("".join(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 3, 8, 30, 120, 250]))))
    return sorted(ids)


def test_the_run_folder_of_a_run_id_is_one_to_one_and_a_plain_folder_name():
    ids = _ids()
    names = {}
    for run_id in ids:
        name = run_folder_name(run_id)
        assert re.fullmatch(r"[A-Za-z0-9_.~-]+", name), (run_id, name)
        assert name not in (".", "..") and not name.startswith(".") and len(name.encode()) <= 200, (run_id, name)
        if "~~" not in name:  # not cut to a digest: the name reads back as the id
            assert _decode(name) == run_id, (run_id, name)
        assert names.setdefault(name, run_id) == run_id, f"{run_id!r} and {names[name]!r} share {name!r}"
    assert len(names) == len(ids) > 15000
    # Ids that are plain folder names already keep their names; the rest are escaped, never folded together.
    assert run_folder_name("local__20261127T120000_ab12cd") == "local__20261127T120000_ab12cd"
    assert run_folder_name("sec~col") == "sec~7Ecol" != run_folder_name("sec_col") == "sec_col"
    assert run_folder_name(".") == "~2E" and run_folder_name("..") == "~2E." and run_folder_name("") == "~"
    assert len({run_folder_name(":" * 250), run_folder_name(":" * 249), run_folder_name(":" * 249 + "+")}) == 3


def test_a_run_never_writes_into_a_folder_another_run_id_owns(tmp_path):
    from hpml.pipelines.runner import claim_run_dir

    folder = str(tmp_path / "penguin" / "sec_col")
    claim_run_dir(folder, "sec_col")
    claim_run_dir(folder, "sec_col")  # a retried first task owns its folder
    assert open(os.path.join(folder, RUN_OWNER_FILE)).read() == "sec_col"
    with pytest.raises(SpecError) as err:  # two ids folded onto one folder (a case-insensitive disk, say)
        claim_run_dir(folder, "SEC_COL")
    assert "'SEC_COL'" in str(err.value) and "belongs to run 'sec_col'" in str(err.value) and err.value.hint
    # A folder an earlier hpml's run wrote (no owner file) is left alone too, and stays as it was.
    old = tmp_path / "penguin" / "scheduled__2026-01-01T00_00_00_00_00"
    (old / "Trainer").mkdir(parents=True)
    with pytest.raises(SpecError, match="belongs to a run of an earlier hpml"):
        claim_run_dir(str(old), "scheduled__2026-01-01T00_00_00_00_00")
    assert os.listdir(old) == ["Trainer"]


def test_a_run_id_of_dots_gets_a_folder_of_its_own(tmp_path, monkeypatch, penguin_csv):
    from hpml.examples.penguin.pipeline import PIPELINE
    from hpml.pipelines import runner

    monkeypatch.setenv("HPML_ARTIFACT_ROOT", str(tmp_path / "artifacts"))
    folders = {run_id: runner.start(PIPELINE, {"epochs": 1}, run_id=run_id).run_dir for run_id in (".", "..", "")}
    assert len(set(folders.values())) == 3
    for run_id, folder in folders.items():
        assert os.path.dirname(folder) == str(tmp_path / "artifacts" / "penguin"), folder
        assert open(os.path.join(folder, RUN_OWNER_FILE)).read() == run_id


def test_the_view_fills_its_template_in_one_pass():
    from hpml.pipelines.templates import fill

    page = "<title>@TITLE@</title><h1>@TITLE@</h1>@BODY@<script nonce=\"@NONCE@\">"
    out = fill(page, {"TITLE": "run @BODY@&lt;b&gt;", "BODY": "<p>no record</p>", "NONCE": "n1"})
    assert out == ("<title>run @BODY@&lt;b&gt;</title><h1>run @BODY@&lt;b&gt;</h1><p>no record</p>"
                   "<script nonce=\"n1\">")
