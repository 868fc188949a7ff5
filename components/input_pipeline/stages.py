"""Per-stage breakdown of a running tf.data pipeline, from tf.data's autotuning model.

`tf.data.experimental.get_model_proto` reports each stage's processing time, element count,
buffered bytes and parallelism. Stages whose input is exhausted drop out of the model, so the
breakdown keeps each stage's latest figures over the snapshots taken while the pipeline runs.
"""
from __future__ import annotations

import json
import os
from typing import Any

from hpml.components import artifacts, files

PARALLELISM_PARAMETERS = ("parallelism", "buffer_size", "cycle_length")
ADVICE = {
    "Map": "raise its num_parallel_calls, vectorise it, or cache after it",
    "Interleave": "read more shards at once (cycle_length), or cache after reading",
    "TFRecord": "read more shards at once (cycle_length), or cache after reading",
    "Batch": "batch less often by parsing larger batches",
    "Prefetch": "the consumer is slower than the pipeline; the input is not the limit",
    "Shuffle": "shrink the shuffle buffer or shuffle after caching",
}


def _nodes_in_order(proto) -> list[tuple[Any, int]]:  # tf.data's model proto nodes
    """The model's nodes from the output towards the sources, each once, with its depth (0: the output)."""
    order, queue, seen = [], [(proto.output, 0)], set()
    while queue:
        node_id, depth = queue.pop(0)
        if node_id in seen or node_id not in proto.nodes:
            continue
        seen.add(node_id)
        node = proto.nodes[node_id]
        order.append((node, depth))
        queue.extend((child, depth + 1) for child in node.inputs)
    return order


def _stage_rows(proto) -> dict[tuple[str, int], dict]:
    """The stages of one model snapshot keyed by (kind, depth), output first; readers at one depth summed."""
    rows: dict[tuple[str, int], dict] = {}
    for node, depth in _nodes_in_order(proto):
        if node.name == "Root":
            continue
        row = rows.setdefault((node.name, depth), {
            "stage": node.name, "nodes": 0, "processing_time_s": 0.0, "num_elements": 0, "buffered_bytes": 0,
            "bytes_produced": 0, "parallelism": None})
        row["nodes"] += 1
        row["processing_time_s"] += node.processing_time / 1e9
        row["num_elements"] += node.num_elements
        row["buffered_bytes"] += node.buffered_bytes
        row["bytes_produced"] += node.bytes_produced
        for parameter in node.parameters:
            if parameter.name in PARALLELISM_PARAMETERS and row["parallelism"] is None:
                row["parallelism"] = {"name": parameter.name, "value": int(parameter.value)}
    return rows


def _finished(rows: dict[tuple[str, int], dict]) -> list[dict]:
    """Rows output first, two stages of one kind numbered from the output, each with its share of the time."""
    ordered = sorted(rows.items(), key=lambda item: item[0][1])  # by depth; stable within one
    repeated = {name for name, _ in rows if sum(other == name for other, _ in rows) > 1}
    seen: dict[str, int] = {}
    for (name, _), row in ordered:
        if name in repeated:
            seen[name] = seen.get(name, 0) + 1
            row["stage"] = f"{name} #{seen[name]}"
    total = sum(row["processing_time_s"] for _, row in ordered) or 1.0
    for _, row in ordered:
        row["share"] = row["processing_time_s"] / total
        row["us_per_element"] = 1e6 * row["processing_time_s"] / row["num_elements"] if row["num_elements"] else 0.0
    return [row for _, row in ordered]


def stages_from_proto(proto) -> list[dict]:
    """One row per stage, output first; Root is the consumer. The readers of every shard, at one depth under
    their interleave, are one stage, summed. Two stages of one kind at different depths (the parse map and
    the map that gathers a shuffled window, say) are two rows, numbered from the output: `ParallelMapV2 #2`."""
    return _finished(_stage_rows(proto))


def unprofiled_reason() -> str | None:
    """Why this TensorFlow cannot give a per-stage breakdown (get_model_proto came in TF 2.17), or None."""
    import tensorflow as tf

    if hasattr(tf.data.experimental, "get_model_proto"):
        return None
    return f"TensorFlow {tf.__version__} has no tf.data.experimental.get_model_proto (TF 2.17 or later has it)"


def profile_pipeline(dataset, max_elements: int | None = None, every: int = 4) -> list[dict]:
    """Run the dataset (up to `max_elements`) and return its per-stage breakdown: each stage as last seen.

    A stage whose input is exhausted (a reader once a cache is full, say) drops out of tf.data's model, so one
    snapshot can miss it; the breakdown keeps each stage's latest figures from every snapshot taken."""
    import tensorflow as tf

    iterator = iter(dataset)
    latest: dict[tuple[str, int], dict] = {}
    for count, _ in enumerate(iterator, start=1):
        if max_elements and count >= max_elements:
            break
        if count % every == 0:
            latest.update(_stage_rows(tf.data.experimental.get_model_proto(iterator)))
    latest.update(_stage_rows(tf.data.experimental.get_model_proto(iterator)))
    return _finished(latest)


# Below this much processing for the whole profiled sample, which stage is slowest changes from run to run
# (the penguin sample, about 1 ms, named a map one run and the shuffle the next), so no advice is given.
WORTH_TUNING_S = 0.05


def recommendation(stages: list[dict]) -> str:
    """One line naming the slowest stage and what to do about it, if the pipeline costs enough to matter."""
    if not stages:
        return "No stage was measured: the pipeline produced too few elements."
    slowest = max(stages, key=lambda r: r["processing_time_s"])
    total = sum(r["processing_time_s"] for r in stages)
    advice = next((text for key, text in ADVICE.items() if key.lower() in slowest["stage"].lower()),
                  "look at this stage first")
    if total < WORTH_TUNING_S:
        advice = "at that cost no stage is worth tuning"
    spent = f"{total * 1e3:.1f} ms" if total < 1 else f"{total:.2f} s"
    width = f", {slowest['parallelism']['name']} {slowest['parallelism']['value']}" if slowest["parallelism"] else ""
    return (f"Slowest stage: {slowest['stage']} ({slowest['share']:.0%} of the {spent} of processing for the "
            f"sample, {slowest['us_per_element']:.1f} µs per element{width}); {advice}.")


def plot_stages(stages: list[dict], path: str, title: str = "tf.data per-stage breakdown") -> str:
    """A stacked bar of each stage's share of processing time, and per-element cost, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (share_ax, cost_ax) = plt.subplots(1, 2, figsize=(12, max(3.0, 0.45 * len(stages) + 1.5)),
                                            gridspec_kw={"width_ratios": [1, 2]})
    colours = [plt.cm.tab20(i) for i in range(20)]
    bottom = 0.0
    for i, row in enumerate(stages):
        share_ax.bar(0, row["share"] * 100, bottom=bottom, color=colours[i % len(colours)], label=row["stage"])
        bottom += row["share"] * 100
    share_ax.set_xticks([])
    share_ax.set_ylabel("share of processing time (%)")
    share_ax.set_ylim(0, 100)
    share_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    names = [row["stage"] for row in stages]
    cost_ax.barh(names, [row["us_per_element"] for row in stages], color=colours[: len(stages)])
    for y, row in enumerate(stages):
        if row["parallelism"]:
            cost_ax.annotate(f" {row['parallelism']['name']}={row['parallelism']['value']}",
                             (row["us_per_element"], y), va="center", fontsize=7)
    cost_ax.invert_yaxis()
    cost_ax.set_xlabel("µs per element (output first, sources last)")
    fig.suptitle(title + "\n" + recommendation(stages), fontsize=9)
    fig.tight_layout()
    with files.open_file(path, "wb") as handle:
        fig.savefig(handle, dpi=110, format="png")
    plt.close(fig)
    return path


def write_breakdown(stages: list[dict], directory: str) -> dict:
    """stages.json and stages.png into `directory`; returns their paths and the recommendation."""
    text = recommendation(stages)
    json_path = os.path.join(directory, artifacts.STAGES_FILE)
    files.write_text(json_path, json.dumps({"stages": stages, "recommendation": text}, indent=2))
    png_path = plot_stages(stages, os.path.join(directory, artifacts.STAGES_PLOT_FILE))
    return {"json": json_path, "png": png_path, "recommendation": text}
