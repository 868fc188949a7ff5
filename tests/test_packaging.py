"""hpml as a package that installs where users already are: one top-level `hpml`, dependency ranges that co-resolve
with TFX 1.21 and with Airflow 3.1 to 3.3, and a wheel that runs the penguin pipeline on another Python.

The resolutions ask the package index (PyPI) through uv, as a user's installer would; nothing is installed by them.
"""
import glob
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _uv() -> str:
    found = shutil.which("uv") or str(REPO / ".tools" / "bin" / "uv")
    assert os.path.exists(found), "uv is installed by `make env` (.tools/bin/uv)"
    return found


# The machines' egress proxy has, in some CI runs, presented a certificate that uv's TLS stack refuses ("invalid
# peer certificate: CaUsedAsEndEntity"), and minutes later one it accepts: such a refusal is tried once more.
TLS_REFUSED = "invalid peer certificate"
TLS_RETRY_AFTER_S = 30


def _run_uv(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """uv with `args`, output captured; a request the proxy's certificate broke is made again, once."""
    done = subprocess.run([_uv(), *args], capture_output=True, text=True, **kwargs)
    if done.returncode != 0 and TLS_REFUSED in done.stderr:
        time.sleep(TLS_RETRY_AFTER_S)
        done = subprocess.run([_uv(), *args], capture_output=True, text=True, **kwargs)
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = _run_uv(["build", "--wheel", "--out-dir", str(out), str(REPO)], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = glob.glob(str(out / "hpml-*.whl"))
    return Path(path)


def test_the_wheel_puts_only_hpml_at_the_top_of_site_packages(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert {name.split("/")[0] for name in names} == {"hpml", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("hpml/v1/__init__.py", "hpml/components/spec.py", "hpml/pipelines/cli.py",
                   "hpml/examples/penguin/module.py", "hpml/components/trainer/launchers/tfjob.yaml",
                   "hpml/pipelines/templates/pipeline.py.tmpl", "hpml/pipelines/templates/module.py.tmpl",
                   "hpml/pipelines/templates/report_view.html", "hpml/pipelines/templates/report.html"):
        assert module in names, module
    assert not any(name.startswith("hpml/tests/") or "/benchmarks/" in name for name in names)
    assert "[hpml.pipelines]\ndistillation = hpml.examples.distillation.pipeline:PIPELINE\n" \
           "penguin = hpml.examples.penguin.pipeline:PIPELINE" in entry_points
    assert "hpml = hpml.pipelines.cli:main" in entry_points


def _compile(requirements: list[str], python: str, platform: str, tmp_path: Path):
    source = tmp_path / "requirements.in"
    source.write_text("\n".join(requirements) + "\n")
    return _run_uv(["pip", "compile", "--quiet", "--python-version", python, "--python-platform", platform,
                    str(source), "-o", str(tmp_path / "resolved.txt")], timeout=600)


def _pins(tmp_path: Path) -> dict[str, str]:
    pins = {}
    for line in (tmp_path / "resolved.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith(" "):
            pins[name.strip().lower()] = version.split(";")[0].strip()
    return pins


@pytest.mark.resolution
def test_hpml_and_tfx_1_21_co_resolve_on_python_3_11(wheel, tmp_path):
    """TFX 1.21, the only TFX for Python 3.11+, needs kubernetes<27 and scikit-learn==1.5.2; its ml-metadata
    needs a glibc 2.39 machine, hence the platform."""
    done = _compile([f"hpml[kubernetes,vertex,examples] @ {wheel.as_uri()}", "tfx==1.21.0"], "3.11",
                    "x86_64-manylinux_2_39", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    pins = _pins(tmp_path)
    assert pins["tfx"] == "1.21.0" and f"hpml @ {wheel.as_uri()}" in (tmp_path / "resolved.txt").read_text()
    assert pins["kubernetes"].startswith("26.") and pins["scikit-learn"] == "1.5.2"
    assert pins["tensorflow"].startswith("2.21.") and pins["tensorflow-transform"].startswith("1.21.")


@pytest.mark.resolution
def test_hpml_and_tfx_1_16_co_resolve_on_python_3_10(wheel, tmp_path):
    """TFX 1.16 (Python 3.10, TF 2.16) is the newest TFX for glibc 2.36 machines; its pins must stay as TFX set them."""
    done = _compile([f"hpml[kubernetes,vertex,examples] @ {wheel.as_uri()}", "tfx[kfp]==1.16.0"], "3.10",
                    "x86_64-manylinux_2_28", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    pins = _pins(tmp_path)
    assert pins["tfx"] == "1.16.0" and pins["tensorflow"].startswith("2.16.")
    assert pins["tensorflow-transform"].startswith("1.16.") and pins["ml-metadata"].startswith("1.16.")


def test_the_tfx_environment_pins_satisfy_hpml_s_own_ranges():
    """infra/tfx-1.16-requirements.txt (the TFX 1.16 environment) is compiled from pyproject.toml: a range changed
    since must be compiled again (`make tfx-requirements`)."""
    from packaging.requirements import Requirement

    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in ("kubernetes", "vertex", "examples")
               for r in project["optional-dependencies"][extra]]
    pins = {}
    for line in (REPO / "infra" / "tfx-1.16-requirements.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    for requirement in wanted:
        name = requirement.name.lower()
        assert name in pins, f"{name} is missing from infra/tfx-1.16-requirements.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {requirement}"


@pytest.mark.resolution
def test_tfx_1_21_and_airflow_3_cannot_share_an_environment_whatever_hpml_does(tmp_path):
    """Why Airflow is an extra: TFX 1.21's ml-metadata pins attrs<24 and every Airflow 3 needs attrs>=24.2."""
    done = _compile(["tfx==1.21.0", "apache-airflow>=3.1,<4"], "3.11", "x86_64-manylinux_2_39", tmp_path)
    assert done.returncode != 0
    assert "ml-metadata" in done.stderr and "attrs" in done.stderr, done.stderr[-3000:]


@pytest.mark.resolution
@pytest.mark.parametrize("airflow", ["3.1", "3.2", "3.3"])
def test_hpml_co_resolves_with_each_airflow_3_minor(wheel, tmp_path, airflow):
    done = _compile([f"hpml[airflow] @ {wheel.as_uri()}", f"apache-airflow=={airflow}.*"], "3.11",
                    "x86_64-manylinux_2_36", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _pins(tmp_path)["apache-airflow"].startswith(f"{airflow}.")


def _other_python() -> str | None:
    """Python 3.12 or 3.13 from pyenv (developer and CI machines have both)."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("pyenv") else os.path.expanduser("~/.pyenv")
    for version in ("3.13", "3.12"):
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")))
        if found:
            return found[-1]
    return None


def test_the_wheel_installed_on_python_3_12_or_3_13_runs_the_penguin_pipeline(wheel, tmp_path):
    """Into a fresh venv of another Python, at the versions uv.lock pins for it; then a run from an empty
    directory, with no checkout on the path and state in the user's data folder."""
    python = _other_python()
    if python is None:
        pytest.skip("no Python 3.12 or 3.13 here (pyenv provides them on developer and CI machines)")
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    constraints = tmp_path / "constraints.txt"
    exported = subprocess.run([_uv(), "export", "--frozen", "--no-hashes", "--no-dev", "--no-emit-project",
                               "--extra", "examples", "--python", version, "--quiet", "--project", str(REPO)],
                              capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    constraints.write_text(exported.stdout)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPML_", "AIRFLOW", "VIRTUAL_ENV"))}
    subprocess.run([_uv(), "venv", "--quiet", "--python", python, str(venv)], check=True, env=env, timeout=300)
    installed = _run_uv(["pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                         f"{wheel}[examples]", "-c", str(constraints)], env=env, timeout=1200)
    assert installed.returncode == 0, installed.stderr[-3000:]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env.update(HOME=str(home), XDG_DATA_HOME="", COLUMNS="200", PYTHONPATH="")
    done = subprocess.run([str(venv / "bin" / "hpml"), "run", "penguin", "--param", "epochs=3"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    state = home / ".local" / "share" / "hpml"
    assert f"artifacts: {state}/artifacts/penguin/local__" in done.stdout
    assert "eval: accuracy=" in done.stdout and (state / "mlflow.db").is_file()
    assert not list(work.iterdir()), "nothing is written to the directory the command ran in"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import hpml, sys; print(hpml.__file__)"],
                          capture_output=True, text=True, env=env, cwd=work).stdout
    assert f"python{version}/site-packages/hpml/__init__.py" in site and str(REPO) not in site
