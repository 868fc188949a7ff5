"""Gantt chart of a pipeline schedule: which stage runs which micro-step when."""
from __future__ import annotations


def plot_gantt(order, forward_costs, path: str, title: str, unit: str = "ms") -> float:
    """Simulate `order` with per-stage forward costs (backward = 2x), save a PNG; returns the bubble."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from components.trainer.gpipe import schedule

    timeline = schedule.simulate(order, forward_cost=forward_costs)
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * len(order)))
    for stage, kind, micro, start, end in timeline.events:
        ax.barh(stage, end - start, left=start, color="tab:blue" if kind == "F" else "tab:orange",
                edgecolor="black", linewidth=0.5)
        ax.text((start + end) / 2, stage, f"{kind}{micro}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(order)), [f"stage {s}" for s in range(len(order))])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit}, from measured per-stage micro-step costs)")
    ax.set_title(f"{title}: bubble {timeline.bubble:.1%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return timeline.bubble
