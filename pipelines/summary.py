"""Render a run record as a table for the terminal."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from hpml.pipelines import records, shipping


def print_summary(summary: records.RunSummary, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"run {summary.run_name} [{summary.status}]", show_lines=False)
    table.add_column("component")
    table.add_column("seconds", justify="right")
    table.add_column("outputs")
    for node, seconds in summary.durations.items():
        outs = summary.outputs.get(node, {})
        table.add_row(node, f"{seconds:.1f}", "\n".join(_relative(summary, v) for _, v in sorted(outs.items())))
    console.print(table)
    console.print(f"artifacts: {summary.tags.get('hpml.run_dir', '?')}", soft_wrap=True)
    if summary.examples:
        console.print("examples: " + " ".join(f"{split}={n}" for split, n in summary.examples.items())
                      + (f"; {summary.bad_rows} bad rows skipped" if summary.bad_rows else "")
                      + (f"; no value in any row: {', '.join(summary.empty_columns)}" if summary.empty_columns else ""),
                      highlight=False)
    if summary.constant_features:
        console.print(f"one value in every transformed train example: {', '.join(summary.constant_features)} "
                      "(the Transform log says why)", highlight=False, soft_wrap=True)
    if summary.eval_metrics:
        console.print("eval: " + "  ".join(f"{k}={v:.4f}" for k, v in sorted(summary.eval_metrics.items())))
    shipped = shipping.outcome(summary.outputs)
    if shipped:
        console.print(f"model: {shipping.describe(shipped)}", soft_wrap=True, highlight=False)
    console.print(f"run record: MLflow run {summary.mlflow_run_id} at {records.tracking_uri()}", soft_wrap=True)
    if summary.tags.get("hpml.report"):
        console.print(f"report: {summary.tags['hpml.report']}", soft_wrap=True, highlight=False)


def _relative(summary: records.RunSummary, uri: str) -> str:
    import os

    run_dir = summary.tags.get("hpml.run_dir")
    return os.path.relpath(uri, run_dir) if run_dir and uri.startswith(run_dir) else uri
