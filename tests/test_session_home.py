"""The per-session HPML_HOME that tests/conftest.py makes is removed when the session ends, unless asked to stay."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("keep", [False, True])
def test_a_session_removes_its_home_at_the_end_unless_told_to_keep_it(tmp_path, keep):
    """A pytest session of one quick test, with its temporary files in `tmp_path`: its home is gone afterwards, or
    kept with HPML_KEEP_TEST_HOME=1."""
    env = {k: v for k, v in os.environ.items() if k not in ("HPML_HOME", "HPML_KEEP_TEST_HOME")}
    env.update(TMPDIR=str(tmp_path), **({"HPML_KEEP_TEST_HOME": "1"} if keep else {}))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_trainer_time.py::test_the_parts_add_up_to_the_trainers_time"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    homes = [name for name in os.listdir(tmp_path) if name.startswith("hpml-test-")]
    assert len(homes) == (1 if keep else 0), homes
