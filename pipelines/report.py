"""One self-contained HTML report per pipeline run, with its plots as PNGs beside it.

Built from the run record (MLflow) and the run's artifacts: parameters, the strategy Plan and
its reasons, loss and metric curves, throughput and step time, the input pipeline's per-stage
breakdown and stall, the GPipe schedule, restarts and recovery, component durations, and for
pipelines with several models (distillation) each model's validation curve and the Evaluator's table.
`report.json` holds the plotted numbers so they can be checked against the record.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import tempfile

from hpml.components import artifacts, files
from hpml.components.errors import HpmlError
from hpml.components.trainer.input_stall import describe_stall
from hpml.components.trainer.step_tuning import TUNED_STEP_FILE
from hpml.pipelines import records

REPORT_DIR = "report"
REPORT_FILE = "report.html"
CURVE_GROUPS = {
    "curves.png": ("Loss and {metric} per epoch",
                   [("loss", "val_loss"), ("accuracy", "val_accuracy", "mae", "val_mae")]),
    "throughput.png": ("Throughput and step time per epoch", [("examples_per_sec",), ("step_time_ms",)]),
}


def report_dir(run_dir: str) -> str:
    return os.path.join(run_dir, REPORT_DIR)


def report_path(run_dir: str) -> str:
    return os.path.join(report_dir(run_dir), REPORT_FILE)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve_title(title: str, series: dict) -> str:
    """A title naming the metric the run has: accuracy for a classifier, mean absolute error for a regressor."""
    return title.format(metric="mean absolute error" if series.get("mae") and not series.get("accuracy")
                        else "accuracy")


def _epoch_axis(ax) -> None:
    """Epochs are whole numbers: no 2.5 on the axis."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _plot_confusion(report: dict, path: str) -> None:
    """The confusion matrix as a heatmap, each cell with its count: where the classifier goes wrong."""
    plt = _plt()
    names, matrix = report["classes"], report["confusion_matrix"]
    size = max(3.5, 0.55 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    peak = max((max(row) for row in matrix), default=0)
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            ax.text(j, i, str(count), ha="center", va="center", fontsize=8,
                    color="white" if count > peak / 2 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(f"Confusion matrix ({report['examples']} eval examples)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_series(series: dict[str, list], panels: list[tuple[str, ...]], title: str, path: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, names in zip(axes[0], panels):
        for name in names:
            points = series.get(name) or []
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        _epoch_axis(ax)
        ax.set_title(" / ".join(n for n in names if series.get(n)) or " / ".join(names))
        ax.grid(alpha=0.3)
        if any(series.get(n) for n in names):
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_durations(durations: dict[str, float], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(durations) + 1.5))
    names = list(durations)
    ax.barh(names, [durations[n] for n in names], color="tab:green")
    for y, name in enumerate(names):
        ax.annotate(f" {durations[name]:.1f} s", (durations[name], y), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("Component durations")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_evaluation(rows: list[dict], path: str) -> None:
    """Accuracy per model, annotated with its parameter count: quality against size at a glance."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    names = [row["name"] for row in rows]
    accuracy = [100 * row["accuracy"] for row in rows]
    ax.barh(names, accuracy, color=["tab:blue" if "student" not in n else "tab:orange" for n in names])
    for y, row in enumerate(rows):
        ax.annotate(f" {100 * row['accuracy']:.2f}%  ({row['params']:,} params)", (100 * row["accuracy"], y),
                    va="center", fontsize=8)
    ax.set_xlim(max(0.0, min(accuracy) - 10), 100 + (100 - max(0.0, min(accuracy) - 10)) * 0.45)
    ax.invert_yaxis()
    ax.set_xlabel("accuracy on the eval split (%)")
    ax.set_title("Models on one eval split")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _read_json(path: str | None):
    if path and files.isfile(path):
        return json.loads(files.read_text(path))
    return None


def collect(mlflow_run_id: str) -> dict:
    """Everything the report shows, as plain data."""
    summary = records.load(mlflow_run_id)
    run = records.client().get_run(mlflow_run_id)
    metrics = run.data.metrics
    names = {n for group in CURVE_GROUPS.values() for panel in group[1] for n in panel}
    # Pipelines with several Trainers record each one's curves under its node id (Teacher_0.val_accuracy).
    node_curves = sorted(k for k in metrics if re.fullmatch(r"[A-Za-z0-9_-]+\.val_accuracy", k))
    series = {name: [list(p) for p in records.history(mlflow_run_id, name)]
              for name in sorted(names) + node_curves if name in metrics}
    evaluation_dir = next((out["evaluation"] for out in summary.outputs.values() if "evaluation" in out), None)
    trainer = summary.outputs.get("Trainer", {})
    pipeline_dir = summary.outputs.get("Transform", {}).get("input_pipeline")
    run_dir = trainer.get("model_run")
    return {
        "run_name": summary.run_name, "mlflow_run_id": mlflow_run_id, "status": summary.status,
        "pipeline": summary.tags.get("hpml.pipeline", ""), "params": dict(sorted(summary.params.items())),
        "data": {"examples": summary.examples, "bad_rows": summary.bad_rows, "input_files": summary.input_files,
                 "empty_columns": summary.empty_columns, "constant_features": summary.constant_features},
        "eval_metrics": summary.eval_metrics, "durations": summary.durations, "series": series,
        "plan": _read_json(os.path.join(run_dir, "plan.json")) if run_dir else None,
        "gpipe": _read_json(os.path.join(run_dir, artifacts.GPIPE_RECORD_FILE)) if run_dir else None,
        "classification": _read_json(os.path.join(run_dir, artifacts.CLASSIFICATION_FILE)) if run_dir else None,
        "model_run_dir": run_dir,
        "experiment_id": run.info.experiment_id, "tracking_uri": records.tracking_uri(),
        "input_stall": _read_json(os.path.join(run_dir, "input_stall.json")) if run_dir else None,
        "tuned_step": _read_json(os.path.join(run_dir, TUNED_STEP_FILE)) if run_dir else None,
        "input_stages": _read_json(os.path.join(pipeline_dir, "stages.json")) if pipeline_dir else None,
        "input_stages_png": os.path.join(pipeline_dir, "stages.png") if pipeline_dir else None,
        "input_decisions": _input_decisions(summary, pipeline_dir),
        "distributed": {k: metrics[k] for k in ("restarts", "steps_lost", "recovery_seconds", "rejoin_seconds")
                        if k in metrics},
        "failed_node": summary.tags.get("hpml.failed_node"), "error": summary.tags.get("hpml.error"),
        "error_hint": summary.tags.get("hpml.error_hint"),
        "retried": {k[len(records.RETRIED_TAG):]: v for k, v in sorted(summary.tags.items())
                    if k.startswith(records.RETRIED_TAG)},
        "run_dir": summary.tags.get("hpml.run_dir"),
        "node_curves": node_curves,
        "evaluation": _read_json(os.path.join(evaluation_dir, "results.json")) if evaluation_dir else None,
    }


def _input_decisions(summary, pipeline_dir: str | None) -> list[tuple[str, str, str]]:
    """(knob, value, why) for each choice the tuner made: from the InputPipeline spec where it is still on disk,
    else the values the run record kept."""
    from hpml.components.input_pipeline.spec import SPEC_FILE

    spec = _read_json(os.path.join(pipeline_dir, SPEC_FILE)) if pipeline_dir else None
    if spec and isinstance(spec.get("decisions"), list):
        return sorted((str(d.get("what")), str(d.get("value")), str(d.get("why", ""))) for d in spec["decisions"])
    return sorted((k[len("input_pipeline."):], v, "") for k, v in summary.tags.items()
                  if k.startswith("input_pipeline."))


def _img(path: str, alt: str) -> str:
    with open(path, "rb") as handle:
        data = base64.b64encode(handle.read()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(rows, header=("", "")) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
         "text-align:left;font-size:14px}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
         "h2{border-bottom:1px solid #ddd;padding-bottom:.2em}.bad{color:#b00}pre{white-space:pre-wrap}")


def open_commands(data: dict) -> list[str]:
    """Shell commands that open the run in the MLflow UI and its training logs in TensorBoard."""
    commands = []
    uri = data.get("tracking_uri") or ""
    if uri:
        server = "" if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri '{uri}'  # then "
        base = uri if not server else "http://127.0.0.1:5000"
        commands.append(f"{server}open {base}/#/experiments/{data['experiment_id']}/runs/{data['mlflow_run_id']}")
    if data.get("model_run_dir") and os.path.isdir(data["model_run_dir"]):
        commands.append(f"tensorboard --logdir '{data['model_run_dir']}'  # then open http://localhost:6006")
    return commands


def _open_section(data: dict) -> str:
    commands = open_commands(data)
    if not commands:
        return ""
    return "<h2>Open this run</h2><pre>" + html.escape("\n".join(commands)) + "</pre>"


def _data_section(data: dict) -> str:
    """What ExampleGen made of the input: examples per split, the rows skip_bad_rows dropped, and the columns
    that held no value in any row; and the features Transform left with one value."""
    files = data["input_files"]
    text = (f"{sum(data['examples'].values())} examples" + (f" from {files} file{'s' if files != 1 else ''}"
                                                            if files else "")
            + ": " + ", ".join(f"{html.escape(split)} {n}" for split, n in data["examples"].items()))
    if data["bad_rows"]:
        text += f"; <b>{data['bad_rows']} bad rows skipped</b> (the ExampleGen log names the first)"
    if data.get("empty_columns"):
        names = ", ".join(html.escape(name) for name in data["empty_columns"])
        text += f"; <b>no value in any row: {names}</b> (disabled in the schema)"
    if data.get("constant_features"):
        names = ", ".join(html.escape(name) for name in data["constant_features"])
        text += (f"; <b>one value in every transformed train example: {names}</b> (a constant column, or one "
                 "value so extreme that its statistics overflowed; the Transform log says more)")
    return f"<h2>Data</h2><p>{text}.</p>"


def _input_pipeline_section(data: dict, pngs: dict[str, str]) -> list[str]:
    """The stall, the stage breakdown and the decisions; nothing (not even the heading) where the run has none,
    as a run that failed before its Trainer."""
    parts = []
    if data["input_stall"]:
        parts.append(f"<p>{html.escape(describe_stall(data['input_stall']))}</p>")
    if data["input_stages"]:
        parts.append(f"<p>{html.escape(data['input_stages']['recommendation'])}</p>")
    if "input_stages.png" in pngs:
        parts.append(_img(pngs["input_stages.png"], "tf.data per-stage breakdown"))
    if data["input_decisions"]:
        parts.append(_table(data["input_decisions"], ("decision", "value", "why")))
    return ["<h2>Input pipeline</h2>", *parts] if parts else []


def _step_section(step: dict | None) -> list[str]:
    """The tuned training step: each knob, why, and what measuring cost."""
    if not step:
        return []
    choice = step["choice"]
    how = ("reused: measured by an earlier run of this model on this data and device" if step.get("reused")
           else f"measured in {step['seconds']:.1f} s, {step.get('trace_s', 0):.1f} s of it tracing the training step, "
                "which training then reuses")
    rows = [(knob, str(choice[knob]), step["reasons"].get(knob, "")) for knob in choice]
    measured = [(m["steps_per_execution"], "on" if m["jit_compile"] else "off", m["precision"],
                 f"{m['examples_per_s']:,.0f}") for m in step.get("measured", [])]
    return ["<h2>Training step</h2>", f"<p>{html.escape(how)}.</p>", _table(rows, ("knob", "value", "why")),
            *([_table(measured, ("steps_per_execution", "XLA", "precision", "examples/s"))] if measured else [])]


def render(data: dict, pngs: dict[str, str]) -> str:
    """The HTML page; `pngs` maps each plot's name to its file."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>hpml run {html.escape(data['run_name'])}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(data['pipeline'])} run {html.escape(data['run_name'])}</h1>",
             f"<p>Status <b>{html.escape(data['status'])}</b>; MLflow run <code>{data['mlflow_run_id']}</code>; "
             f"artifacts <code>{html.escape(str(data['run_dir']))}</code>.</p>"]
    if data["failed_node"]:
        parts.append(f"<p class='bad'>Failed in {html.escape(data['failed_node'])}: "
                     f"{html.escape(data['error'] or '')}</p>")
        if data.get("error_hint"):
            parts.append(f"<p>What to do: {html.escape(data['error_hint'])}</p>")
    for node, error in data.get("retried", {}).items():
        parts.append(f"<p>{html.escape(node)} was retried; a try before failed: {html.escape(error)}</p>")
    parts.append(_open_section(data))
    parts.append("<h2>Parameters</h2>" + _table(data["params"].items(), ("parameter", "value")))
    if data["data"]["examples"]:
        parts.append(_data_section(data["data"]))
    if data["eval_metrics"]:
        parts.append("<h2>Evaluation</h2>" + _table(
            [(k, f"{v:.4f}") for k, v in sorted(data["eval_metrics"].items())], ("metric", "value")))
    if data.get("classification"):
        report = data["classification"]
        parts.append("<h2>Per class</h2>" + _table(
            [(r["class"], f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['f1']:.3f}", r["support"])
             for r in report["per_class"]], ("class", "precision", "recall", "F1", "eval examples")))
        if "confusion.png" in pngs:
            parts.append(_img(pngs["confusion.png"], "confusion matrix"))
    if data["plan"]:
        plan = data["plan"]
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in plan.get("reasons", []))
        parts.append(f"<h2>Strategy plan: {html.escape(plan.get('strategy', '?'))}</h2><ul>{reasons}</ul>")
    parts += _step_section(data["tuned_step"])
    if data["evaluation"]:
        ev = data["evaluation"]
        parts.append(f"<h2>Models on the {html.escape(ev['split'])} split ({ev['examples']} examples)</h2>" + _table(
            [(r["name"], f"{100 * r['accuracy']:.2f}%", f"{r['params']:,}", f"{r['size_bytes'] / 1024:.0f} KiB",
              f"{r['latency_us']:.2f} µs") for r in ev["rows"]],
            ("model", "accuracy", "parameters", "SavedModel", "latency / example")))
        if ev.get("distillation"):
            d = ev["distillation"]
            parts.append(f"<p>Distillation closed <b>{100 * d['gap_closed']:.0f}%</b> of the gap between the student "
                         f"from scratch and the teacher, with {d['param_ratio']:.3f} of its parameters.</p>")
        if "evaluation.png" in pngs:
            parts.append(_img(pngs["evaluation.png"], "accuracy per model"))
    if "node_curves.png" in pngs:
        parts.append("<h2>Validation accuracy per model</h2>" + _img(pngs["node_curves.png"], "per-model curves"))
    for name, (title, _) in CURVE_GROUPS.items():
        if name in pngs:
            title = _curve_title(title, data["series"])
            parts.append(f"<h2>{title}</h2>" + _img(pngs[name], title))
    parts += _input_pipeline_section(data, pngs)
    if data["gpipe"]:
        g = data["gpipe"]
        parts.append(f"<h2>GPipe schedule</h2><p>K={g['num_stages']} stages, M={g['num_micro_batches']} "
                     f"micro-batches, schedule {g['schedule']}, remat {g['remat']}, balance {g['balance']}; "
                     f"bubble {g['measured_bubble']:.1%} from measured stage costs against "
                     f"{g['expected_bubble']:.1%} expected.</p>")
        if "gantt.png" in pngs:
            parts.append(_img(pngs["gantt.png"], "GPipe schedule"))
        if "executed_bubble" in g:
            parts.append(f"<p>One executed step, traced with the TF profiler: every stage ran its micro-steps "
                         f"{'in' if g['executed_in_schedule_order'] else '<b>not</b> in'} schedule order; "
                         f"measured bubble {g['executed_bubble']:.1%}.</p>")
        if "executed_gantt.png" in pngs:
            parts.append(_img(pngs["executed_gantt.png"], "GPipe executed step"))
    if data["distributed"]:
        parts.append("<h2>Fault tolerance</h2>" + _table(
            [(k.replace("_", " "), f"{v:g}") for k, v in data["distributed"].items()], ("measure", "value")))
    if "durations.png" in pngs:
        parts.append("<h2>Component durations</h2>" + _img(pngs["durations.png"], "component durations"))
    parts.append("</body></html>")
    return "\n".join(parts)


def build(mlflow_run_id: str, log_to_mlflow: bool = True) -> str:
    """Write the report (atomically) under the run directory, local or on an object store; returns report.html's
    path."""
    data = collect(mlflow_run_id)
    if not data["run_dir"]:
        raise HpmlError(f"run {mlflow_run_id} has no run directory tag", hint="was it started by hpml?")
    final = report_dir(data["run_dir"])
    # Rendered on local disk (matplotlib and MLflow's log_artifacts write and read local files), then published.
    with tempfile.TemporaryDirectory(prefix="hpml-report-") as out:
        _render(data, out)
        with artifacts.publish(final) as published:
            for name, _ in files.walk_files(out):
                with open(os.path.join(out, name), "rb") as source, \
                        files.open_file(os.path.join(published, name), "wb") as target:
                    shutil.copyfileobj(source, target)
        if log_to_mlflow:
            records.client().log_artifacts(mlflow_run_id, out, artifact_path=REPORT_DIR)
    return os.path.join(final, REPORT_FILE)


def _render(data: dict, out: str) -> None:
    """The report's plots, report.json and report.html into the local folder `out`."""
    pngs = {}
    for name, (title, panels) in CURVE_GROUPS.items():
        if any(data["series"].get(n) for panel in panels for n in panel):
            pngs[name] = os.path.join(out, name)
            _plot_series(data["series"], panels, _curve_title(title, data["series"]), pngs[name])
    if data["evaluation"]:
        pngs["evaluation.png"] = os.path.join(out, "evaluation.png")
        _plot_evaluation(data["evaluation"]["rows"], pngs["evaluation.png"])
    if data["node_curves"]:
        pngs["node_curves.png"] = os.path.join(out, "node_curves.png")
        _plot_series(data["series"], [tuple(data["node_curves"])], "Validation accuracy per epoch",
                     pngs["node_curves.png"])
    if data.get("classification"):
        pngs["confusion.png"] = os.path.join(out, "confusion.png")
        _plot_confusion(data["classification"], pngs["confusion.png"])
    if data["durations"]:
        pngs["durations.png"] = os.path.join(out, "durations.png")
        _plot_durations(data["durations"], pngs["durations.png"])
    if data["input_stages_png"] and files.isfile(data["input_stages_png"]):
        pngs["input_stages.png"] = os.path.join(out, "input_stages.png")
        with files.open_file(data["input_stages_png"], "rb") as source, \
                open(pngs["input_stages.png"], "wb") as target:
            shutil.copyfileobj(source, target)
    if data["gpipe"] and data["gpipe"].get("stage_costs_s"):
        from hpml.components.trainer.gpipe import schedule
        from hpml.components.trainer.gpipe.plot import plot_gantt

        g = data["gpipe"]
        order = schedule.build(g["schedule"], g["num_stages"], g["num_micro_batches"])
        pngs["gantt.png"] = os.path.join(out, "gantt.png")
        plot_gantt(order, [1e3 * c for c in g["stage_costs_s"]], pngs["gantt.png"],
                   f"{g['schedule']} K={g['num_stages']} M={g['num_micro_batches']}")
        if g.get("executed_events"):
            from hpml.components.trainer.gpipe.plot import plot_executed
            from hpml.components.trainer.gpipe.trace import OpEvent

            pngs["executed_gantt.png"] = os.path.join(out, "executed_gantt.png")
            plot_executed([OpEvent(*row) for row in g["executed_events"]], g["num_stages"],
                          pngs["executed_gantt.png"], f"executed {g['schedule']} step")
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as handle:
        json.dump({k: v for k, v in data.items() if k != "input_stages"}, handle, indent=2, default=str)
    with open(os.path.join(out, REPORT_FILE), "w", encoding="utf-8") as handle:
        handle.write(render(data, pngs))


def plot_overlay(run_ids: list[str], labels: list[str], path: str) -> dict[str, dict[str, list]]:
    """Both runs' per-epoch curves on shared axes; returns the plotted series per run."""
    names = [("loss", "val_loss"), ("accuracy", "val_accuracy"), ("examples_per_sec",)]
    plotted = {label: {n: [list(p) for p in records.history(run_id, n)] for panel in names for n in panel}
               for run_id, label in zip(run_ids, labels)}
    plt = _plt()
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.8))
    styles = ["-", "--"]
    for ax, panel in zip(axes, names):
        for (label, series), style in zip(plotted.items(), styles):
            for name in panel:
                points = series[name]
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", markersize=3,
                            label=f"{name} ({label})")
        _epoch_axis(ax)
        ax.set_title(" / ".join(panel))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{labels[0]} (solid) vs {labels[1]} (dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return plotted
