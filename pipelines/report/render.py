"""The report's HTML: the page template (templates/report.html) filled with one section per part of the run, each
present only where the run has something to show. Every value from the run is escaped."""
from __future__ import annotations

import base64
import html
import os

from hpml.components.trainer.input_stall import describe_stall
from hpml.components.trainer.time_breakdown import DESCRIPTIONS
from hpml.pipelines import shipping
from hpml.pipelines.report.plots import CURVE_GROUPS, curve_title
from hpml.pipelines.templates import render as render_template

PAGE_TEMPLATE = "report.html"  # in hpml.pipelines.templates


def _img(path: str, alt: str) -> str:
    with open(path, "rb") as handle:
        data = base64.b64encode(handle.read()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(rows, header=("", "")) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


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


def _heading(data: dict, pngs: dict) -> list[str]:
    """Name, status and where the run is; the failure and what to do about it; the retries before it."""
    parts = [f"<h1>{html.escape(data['pipeline'])} run {html.escape(data['run_name'])}</h1>",
             f"<p>Status <b>{html.escape(data['status'])}</b>; MLflow run <code>{data['mlflow_run_id']}</code>; "
             f"artifacts <code>{html.escape(str(data['run_dir']))}</code>.</p>"]
    if data["failed_node"]:
        parts.append(f"<p class='bad'>Failed in {html.escape(data['failed_node'])}: "
                     f"{html.escape(data['error'] or '')}</p>")
        if data.get("error_hint"):
            parts.append(f"<p>What to do: {html.escape(data['error_hint'])}</p>")
    for node, error in data.get("retried", {}).items():
        parts.append(f"<p>{html.escape(node)} was retried; a try before failed: {html.escape(error)}</p>")
    commands = open_commands(data)
    parts.append("<h2>Open this run</h2><pre>" + html.escape("\n".join(commands)) + "</pre>" if commands else "")
    parts.append("<h2>Parameters</h2>" + _table(data["params"].items(), ("parameter", "value")))
    return parts


def _data(data: dict, pngs: dict) -> list[str]:
    """What ExampleGen made of the input: examples per split, the rows skip_bad_rows dropped, and the columns
    that held no value in any row; and the features Transform left with one value."""
    found = data["data"]
    if not found["examples"]:
        return []
    count = found["input_files"]
    text = (f"{sum(found['examples'].values())} examples" + (f" from {count} file{'s' if count != 1 else ''}"
                                                             if count else "")
            + ": " + ", ".join(f"{html.escape(split)} {n}" for split, n in found["examples"].items()))
    if found["bad_rows"]:
        text += f"; <b>{found['bad_rows']} bad rows skipped</b> (the ExampleGen log names the first)"
    if found.get("empty_columns"):
        names = ", ".join(html.escape(name) for name in found["empty_columns"])
        text += f"; <b>no value in any row: {names}</b> (disabled in the schema)"
    if found.get("constant_features"):
        names = ", ".join(html.escape(name) for name in found["constant_features"])
        text += (f"; <b>one value in every transformed train example: {names}</b> (a constant column, or one "
                 "value so extreme that its statistics overflowed; the Transform log says more)")
    return [f"<h2>Data</h2><p>{text}.</p>"]


def _evaluation(data: dict, pngs: dict) -> list[str]:
    """The eval metrics, and per class with the confusion matrix for a classifier."""
    parts = []
    if data["eval_metrics"]:
        parts.append("<h2>Evaluation</h2>" + _table(
            [(k, f"{v:.4f}") for k, v in sorted(data["eval_metrics"].items())], ("metric", "value")))
    if data.get("classification"):
        parts.append("<h2>Per class</h2>" + _table(
            [(r["class"], f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['f1']:.3f}", r["support"])
             for r in data["classification"]["per_class"]], ("class", "precision", "recall", "F1", "eval examples")))
        if "confusion.png" in pngs:
            parts.append(_img(pngs["confusion.png"], "confusion matrix"))
    return parts


def _shipping(data: dict, pngs: dict) -> list[str]:
    """Whether the Gate blessed the model and why, metric by metric, and where the Pusher put it."""
    found = data.get("shipping")
    if not found:
        return []
    gate = found["gate"]
    champion = gate.get("champion") or {}
    against = (f"the champion, version {champion['version']} in {champion['destination']}" if "version" in champion
               else f"the baseline model {champion['model']}" if "model" in champion else "no champion yet")
    rows = [(check["metric"], f"{check['candidate']:.4f}", _optional(check["champion"]),
             _optional(check["threshold"]), _optional(check["margin"]), "pass" if check["passed"] else "FAIL")
            for check in gate["checks"]]
    css = "" if gate["blessed"] else " class='bad'"
    return [f"<h2>Gate and push</h2><p{css}>The model is {html.escape(shipping.describe(found))}.</p>",
            f"<p>Scored on {gate['examples']} {html.escape(gate['split'])} examples against "
            f"{html.escape(str(against))}.</p>",
            _table(rows, ("metric", "candidate", "champion", "threshold", "margin", ""))]


def _optional(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _plan(data: dict, pngs: dict) -> list[str]:
    """The strategy the Trainer chose and why; then the tuned training step: each knob, why, and its cost."""
    parts = []
    if data["plan"]:
        plan = data["plan"]
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in plan.get("reasons", []))
        parts.append(f"<h2>Strategy plan: {html.escape(plan.get('strategy', '?'))}</h2><ul>{reasons}</ul>")
    step = data["tuned_step"]
    if step:
        choice = step["choice"]
        how = ("reused: measured by an earlier run of this model on this data and device" if step.get("reused")
               else f"measured in {step['seconds']:.1f} s, {step.get('trace_s', 0):.1f} s of it tracing the "
                    "training step, which training then reuses")
        rows = [(knob, str(choice[knob]), step["reasons"].get(knob, "")) for knob in choice]
        measured = [(m["steps_per_execution"], "on" if m["jit_compile"] else "off", m["precision"],
                     f"{m['examples_per_s']:,.0f}") for m in step.get("measured", [])]
        parts += ["<h2>Training step</h2>", f"<p>{html.escape(how)}.</p>", _table(rows, ("knob", "value", "why")),
                  *([_table(measured, ("steps_per_execution", "XLA", "precision", "examples/s"))] if measured else [])]
    return parts


def _models(data: dict, pngs: dict) -> list[str]:
    """Pipelines with several models (distillation): the Evaluator's table, the gap closed, and each model's
    validation curve."""
    parts = []
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
    return parts


def _curves(data: dict, pngs: dict) -> list[str]:
    parts = []
    for name, (title, _) in CURVE_GROUPS.items():
        if name in pngs:
            title = curve_title(title, data["series"])
            parts.append(f"<h2>{title}</h2>" + _img(pngs[name], title))
    return parts


def _input_pipeline(data: dict, pngs: dict) -> list[str]:
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


def _gpipe(data: dict, pngs: dict) -> list[str]:
    """The GPipe schedule: its shape, the bubble measured against the bubble expected, the executed step."""
    g = data["gpipe"]
    if not g:
        return []
    parts = [f"<h2>GPipe schedule</h2><p>K={g['num_stages']} stages, M={g['num_micro_batches']} "
             f"micro-batches, schedule {g['schedule']}, remat {g['remat']}, balance {g['balance']}; "
             f"bubble {g['measured_bubble']:.1%} from measured stage costs against "
             f"{g['expected_bubble']:.1%} expected.</p>"]
    if "gantt.png" in pngs:
        parts.append(_img(pngs["gantt.png"], "GPipe schedule"))
    if "executed_bubble" in g:
        parts.append(f"<p>One executed step, traced with the TF profiler: every stage ran its micro-steps "
                     f"{'in' if g['executed_in_schedule_order'] else '<b>not</b> in'} schedule order; "
                     f"measured bubble {g['executed_bubble']:.1%}.</p>")
    if "executed_gantt.png" in pngs:
        parts.append(_img(pngs["executed_gantt.png"], "GPipe executed step"))
    return parts


def _time(data: dict, pngs: dict) -> list[str]:
    """Restarts and recovery, and where the run's time went."""
    parts = []
    if data["distributed"]:
        parts.append("<h2>Fault tolerance</h2>" + _table(
            [(k.replace("_", " "), f"{v:g}") for k, v in data["distributed"].items()], ("measure", "value")))
    if "durations.png" in pngs:
        parts.append("<h2>Component durations</h2>" + _img(pngs["durations.png"], "component durations"))
    if data.get("trainer_time"):
        spent = data["trainer_time"]
        total = sum(spent.values()) or 1.0
        rows = [(part.replace("_", " "), f"{seconds:.1f} s", f"{seconds / total:.0%}", DESCRIPTIONS[part])
                for part, seconds in spent.items()]
        parts.append(f"<h2>Where the Trainer's time went</h2><p>{total:.1f} s in all; its epochs took "
                     f"{spent.get('epochs', 0.0) / total:.0%}.</p>")
        parts.append(_table(rows, ("part", "seconds", "share", "what")))
        if "trainer_time.png" in pngs:
            parts.append(_img(pngs["trainer_time.png"], "where the Trainer's time went"))
    return parts


SECTIONS = (_heading, _data, _evaluation, _shipping, _plan, _models, _curves, _input_pipeline, _gpipe, _time)


def render(data: dict, pngs: dict[str, str]) -> str:
    """The HTML page; `pngs` maps each plot's name to its file."""
    body = [part for section in SECTIONS for part in section(data, pngs)]
    return render_template(PAGE_TEMPLATE, {"RUN_NAME": html.escape(data["run_name"]), "BODY": "\n".join(body)})
