"""`hpml runs`: the recent runs as a table, or two runs side by side with an overlay plot of their training."""
from __future__ import annotations

import datetime
import os

from hpml.components.errors import HpmlError


def add_parser(sub) -> None:
    runs = sub.add_parser("runs", help="list recent runs, or compare two")
    runs.add_argument("action", nargs="?", choices=("list", "compare"), default="list")
    runs.add_argument("runs", nargs="*", help="with compare: two run ids (or unique prefixes of them) or names")
    runs.add_argument("--pipeline", default=None)
    runs.add_argument("--limit", type=int, default=20)
    runs.set_defaults(func=cmd_runs)


def cmd_runs(args) -> int:
    from rich.console import Console

    console = Console()
    if args.action == "compare":
        return _compare(args.runs, console)
    if args.runs:
        raise HpmlError(f"runs list takes no run ids (got {' '.join(args.runs)})",
                        hint="hpml runs compare RUN_A RUN_B compares two runs")
    return _list(args.pipeline, args.limit, console)


def _compare(names: list[str], console) -> int:
    """Two runs' parameters, examples, eval and durations side by side, and their training curves overlaid."""
    from hpml.pipelines import records
    from hpml.pipelines.paths import hpml_home
    from hpml.pipelines.report import plot_overlay

    if len(names) != 2:
        raise HpmlError("runs compare takes two run ids", hint="hpml runs compare RUN_A RUN_B")
    ids = [records.resolve(r) for r in names]
    if ids[0] == ids[1]:
        raise HpmlError(f"{names[0]!r} and {names[1]!r} are the same run ({ids[0][:records.SHORT_ID]})",
                        hint="compare two different runs; hpml runs lists them")
    a, b = (records.load(i) for i in ids)
    # Runs that share a name (a re-used Airflow run id, say) are told apart by their ids.
    labels = [a.run_name, b.run_name] if a.run_name != b.run_name else \
        [f"{r.run_name} ({r.mlflow_run_id[:records.SHORT_ID]})" for r in (a, b)]
    _print_table(console, _comparison(a, b, labels))
    folder = os.path.join(hpml_home(), "compare")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{a.mlflow_run_id[:8]}_vs_{b.mlflow_run_id[:8]}.png")
    plot_overlay([a.mlflow_run_id, b.mlflow_run_id], labels, path)
    console.print(f"overlay plot: {path}", soft_wrap=True)
    return 0


def _comparison(a, b, labels: list[str]):
    """The comparison table of two run summaries; rows that differ are bold."""
    from rich.table import Table

    table = Table(title="run comparison")
    table.add_column("")
    table.add_column(labels[0])
    table.add_column(labels[1])
    for key in sorted(set(a.params) | set(b.params)):
        va, vb = a.params.get(key, "-"), b.params.get(key, "-")
        table.add_row(f"param {key}", va, vb, style=None if va == vb else "bold")
    for split in [*a.examples, *(s for s in b.examples if s not in a.examples)]:
        va, vb = (str(r.examples[split]) if split in r.examples else "-" for r in (a, b))
        table.add_row(f"examples {split}", va, vb, style=None if va == vb else "bold")
    if a.bad_rows or b.bad_rows:
        table.add_row("bad rows skipped", str(a.bad_rows), str(b.bad_rows),
                      style=None if a.bad_rows == b.bad_rows else "bold")
    for key in sorted(set(a.eval_metrics) | set(b.eval_metrics)):
        table.add_row(f"eval {key}", _fmt(a.eval_metrics.get(key)), _fmt(b.eval_metrics.get(key)))
    for key in [*a.durations, *(k for k in b.durations if k not in a.durations)]:  # in run order
        va, vb = (f"{r.durations[key]:.1f}" if key in r.durations else "-" for r in (a, b))
        table.add_row(f"{key} seconds", va, vb)
    return table


def _list(pipeline: str | None, limit: int, console) -> int:
    """The most recent runs, newest first, of one pipeline or all."""
    from rich import box
    from rich.table import Table

    from hpml.pipelines import records

    if limit < 1:
        raise HpmlError(f"--limit must be at least 1, not {limit}", hint="e.g. hpml runs --limit 20")
    runs = records.recent(pipeline, limit)
    if not runs and pipeline is not None:
        _check_pipeline_name(pipeline)
    if not runs:
        console.print(f"no runs of {pipeline} yet" if pipeline else "no runs yet")
        return 0
    table = Table(title="recent runs", caption="hpml report ID | hpml runs compare ID ID", box=box.SIMPLE_HEAD,
                  collapse_padding=True, pad_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("name", overflow="fold", ratio=1)
    table.add_column("status", no_wrap=True)
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("accuracy", no_wrap=True)
    table.add_column("strategy", overflow="fold", min_width=8)
    table.add_column("epochs", no_wrap=True)
    table.add_column("pushed", no_wrap=True)
    for run in runs:
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000, datetime.UTC)
        table.add_row(
            run.info.run_id[:records.SHORT_ID], run.info.run_name, _status(run), f"{started:%Y-%m-%d %H:%M}",
            _fmt(run.data.metrics.get("eval_accuracy")), run.data.params.get("strategy", "-"),
            run.data.params.get("epochs", "-"), _pushed(run.data.tags),
        )
    _print_table(console, table)
    return 0


def _pushed(tags: dict) -> str:
    """The version a run pushed, "no" when its gate held the model back, "-" for a run without a pusher."""
    if "hpml.pushed" not in tags:
        return "-"
    return f"v{tags['hpml.pushed_version']}" if tags["hpml.pushed"] == "true" else "no"


def _check_pipeline_name(name: str) -> None:
    """A name with no runs is either a pipeline not run yet or a typo: refuse it unless it is recorded or found."""
    from hpml.components.errors import known_names
    from hpml.pipelines import discovery, records

    recorded = set(records.pipeline_names())
    if name in recorded:
        return
    try:
        discovery.load(name)
    except HpmlError:
        raise HpmlError(f"unknown pipeline {name!r}",
                        hint=known_names("pipelines", name, recorded | set(discovery.registered()))) from None


def _print_table(console, table) -> None:
    """A table on a terminal fits its width; piped or redirected with no COLUMNS set, each row stays on
    one line (rich would otherwise fold long names at 80 columns, which breaks `hpml runs | grep`), and
    lines lose the spaces that pad them to the table's width."""
    if console.is_terminal:
        console.print(table)
        return
    if "COLUMNS" not in os.environ:
        console.width = console.measure(table, options=console.options.update_width(10_000)).maximum
    with console.capture() as captured:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _status(run) -> str:
    """The run's status; a failed run's second line names the component that failed."""
    failed_node = run.data.tags.get("hpml.failed_node")
    return f"{run.info.status}\n{failed_node}" if run.info.status == "FAILED" and failed_node else run.info.status


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"
