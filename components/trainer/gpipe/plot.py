"""Gantt charts of a pipeline step: simulated from per-stage costs, or executed (profiler trace)."""
from __future__ import annotations


def plot_gantt(order, forward_costs, path: str, title: str, unit: str = "ms") -> float:
    """Simulate `order` with per-stage forward costs (backward = 2x), save a PNG; returns the bubble."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpml.components.trainer.gpipe import schedule

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


def plot_executed(events, num_stages: int, path: str, title: str) -> float:
    """Every executed op of one traced step as a bar on its stage's row; returns the measured bubble."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpml.components.trainer.gpipe import trace

    bubble = trace.measured_bubble(events, num_stages)
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * num_stages))
    for event in events:
        ax.barh(event.stage, max(event.end_ms - event.start_ms, 1e-3), left=event.start_ms, height=0.6,
                color="tab:blue" if event.kind == "F" else "tab:orange")
    steps: dict = {}
    for event in events:
        steps.setdefault((event.stage, event.kind, event.micro), []).append(event)
    for (stage, kind, micro), ops in steps.items():
        longest = max(ops, key=lambda e: e.end_ms - e.start_ms)
        ax.text(longest.start_ms, stage - 0.4, f"{kind}{micro}", fontsize=6, va="bottom")
    ax.set_yticks(range(num_stages), [f"stage {s}" for s in range(num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, executed ops from the TF profiler; blue forward, orange backward)")
    ax.set_title(f"{title}: measured bubble {bubble:.1%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return bubble
