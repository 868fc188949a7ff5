"""The docs do what they say: the quickstart's commands print what it shows, the README's Python example runs as
written, and every link between the docs resolves."""
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

from tests.helpers import doc_blocks, quickstart_csv

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_quickstart_init_prints_what_the_quickstart_shows(tmp_path):
    data = quickstart_csv(tmp_path)
    done = subprocess.run([sys.executable, "-m", "hpml.pipelines.cli", "init", "churn", "--csv", str(data),
                           "--label", "churned"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shown = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    first = done.stdout.splitlines()[0]
    assert f"\n{first}\n" in shown, (first, "the quickstart shows another first line")
    assert done.stdout.splitlines()[-1] == "next: hpml run churn" and "next: hpml run churn" in shown
    assert sorted(p.name for p in (tmp_path / "churn").iterdir()) == ["dag.py", "module.py", "pipeline.py"]


def test_the_readme_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's pipeline, run as a script (`python example.py`) from a folder holding its data and module."""
    from hpml.pipelines import records, scaffold

    (tmp_path / "data").mkdir()
    os.replace(quickstart_csv(tmp_path), tmp_path / "data" / "churn.csv")
    scaffold.init_project("churn", str(tmp_path / "data" / "churn.csv"), "churned", directory=str(tmp_path))
    example = tmp_path / "example.py"
    example.write_text(doc_blocks(REPO / "README.md", "python")[0], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    before = {run.info.run_id for run in records.recent("churn", 50)}
    runpy.run_path(str(example), run_name="__main__")
    after = [run for run in records.recent("churn", 50) if run.info.run_id not in before]
    assert len(after) == 1 and after[0].info.status == "FINISHED"
    summary = records.load(after[0].info.run_id)
    assert summary.params["strategy"] == "mirrored" and summary.params["epochs"] == "5"
    assert summary.eval_metrics["accuracy"] > 0.7, summary.eval_metrics


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_the_readme_stays_a_short_entry_point():
    assert len((REPO / "README.md").read_bytes()) < 10_000
