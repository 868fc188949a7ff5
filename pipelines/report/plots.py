"""The report's plots, drawn with matplotlib into PNG files: curves per epoch, the confusion matrix, component
durations, models against each other, and the GPipe schedule."""
from __future__ import annotations

import os
import shutil

from hpml.components import files

# Plot file -> (title, panels of series names); the title's {metric} is the run's accuracy-like metric.
CURVE_GROUPS: dict[str, tuple[str, list[tuple[str, ...]]]] = {
    "curves.png": ("Loss and {metric} per epoch",
                   [("loss", "val_loss"), ("accuracy", "val_accuracy", "mae", "val_mae")]),
    "throughput.png": ("Throughput and step time per epoch", [("examples_per_sec",), ("step_time_ms",)]),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve_title(title: str, series: dict) -> str:
    """A title naming the metric the run has: accuracy for a classifier, mean absolute error for a regressor."""
    return title.format(metric="mean absolute error" if series.get("mae") and not series.get("accuracy")
                        else "accuracy")


def _epoch_axis(ax) -> None:
    """Epochs are whole numbers: no 2.5 on the axis."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, path: str) -> None:
    plt = _plt()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(report: dict, path: str) -> None:
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
    _save(fig, path)


def plot_series(series: dict[str, list], panels: list[tuple[str, ...]], title: str, path: str) -> None:
    """One panel per group of series names, each series a line over epochs."""
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
    _save(fig, path)


def plot_durations(durations: dict[str, float], path: str, title: str = "Component durations") -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(durations) + 1.5))
    names = list(durations)
    ax.barh(names, [durations[n] for n in names], color="tab:green")
    for y, name in enumerate(names):
        ax.annotate(f" {durations[name]:.1f} s", (durations[name], y), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(title)
    _save(fig, path)


def plot_evaluation(rows: list[dict], path: str) -> None:
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
    _save(fig, path)


def _plot_gpipe(g: dict, out: str, pngs: dict[str, str]) -> None:
    """The planned schedule from the measured stage costs, and the executed step where one was traced."""
    from hpml.components.trainer.gpipe import schedule
    from hpml.components.trainer.gpipe.plot import plot_executed, plot_gantt
    from hpml.components.trainer.gpipe.trace import OpEvent

    order = schedule.build(g["schedule"], g["num_stages"], g["num_micro_batches"])
    pngs["gantt.png"] = os.path.join(out, "gantt.png")
    plot_gantt(order, [1e3 * c for c in g["stage_costs_s"]], pngs["gantt.png"],
               f"{g['schedule']} K={g['num_stages']} M={g['num_micro_batches']}")
    if g.get("executed_events"):
        pngs["executed_gantt.png"] = os.path.join(out, "executed_gantt.png")
        plot_executed([OpEvent(*row) for row in g["executed_events"]], g["num_stages"],
                      pngs["executed_gantt.png"], f"executed {g['schedule']} step")


def draw_all(data: dict, out: str) -> dict[str, str]:
    """Every plot the collected `data` has numbers for, into the local folder `out`; returns name -> file."""
    pngs = {}
    for name, (title, panels) in CURVE_GROUPS.items():
        if any(data["series"].get(n) for panel in panels for n in panel):
            pngs[name] = os.path.join(out, name)
            plot_series(data["series"], panels, curve_title(title, data["series"]), pngs[name])
    if data["evaluation"]:
        pngs["evaluation.png"] = os.path.join(out, "evaluation.png")
        plot_evaluation(data["evaluation"]["rows"], pngs["evaluation.png"])
    if data["node_curves"]:
        pngs["node_curves.png"] = os.path.join(out, "node_curves.png")
        plot_series(data["series"], [tuple(data["node_curves"])], "Validation accuracy per epoch",
                    pngs["node_curves.png"])
    if data.get("classification"):
        pngs["confusion.png"] = os.path.join(out, "confusion.png")
        plot_confusion(data["classification"], pngs["confusion.png"])
    if data["durations"]:
        pngs["durations.png"] = os.path.join(out, "durations.png")
        plot_durations(data["durations"], pngs["durations.png"])
    if data.get("trainer_time"):
        pngs["trainer_time.png"] = os.path.join(out, "trainer_time.png")
        plot_durations({part.replace("_", " "): s for part, s in data["trainer_time"].items()},
                       pngs["trainer_time.png"], "Where the Trainer's time went")
    if data["input_stages_png"] and files.isfile(data["input_stages_png"]):  # drawn by Transform's tuner
        pngs["input_stages.png"] = os.path.join(out, "input_stages.png")
        with files.open_file(data["input_stages_png"], "rb") as source, \
                open(pngs["input_stages.png"], "wb") as target:
            shutil.copyfileobj(source, target)
    if data["gpipe"] and data["gpipe"].get("stage_costs_s"):
        _plot_gpipe(data["gpipe"], out, pngs)
    return pngs


def plot_overlay(run_ids: list[str], labels: list[str], path: str) -> dict[str, dict[str, list]]:
    """Both runs' per-epoch curves on shared axes; returns the plotted series per run."""
    from hpml.pipelines import records

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
    _save(fig, path)
    return plotted
