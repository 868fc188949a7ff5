"""Pipeline schedules as per-stage op lists, and a clock simulator that checks their shape.

An op is ("F", m) or ("B", m) for micro-batch m. F(s, m) needs F(s-1, m); B(s, m) needs
F(s, m) and B(s+1, m). One op takes one clock cycle; each stage runs its ops in list order.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpml.components.errors import SpecError


def gpipe(num_stages: int, num_micro: int) -> list[list[tuple[str, int]]]:
    """Fill then drain: every forward, then every backward in reverse micro-batch order."""
    return [[("F", m) for m in range(num_micro)] + [("B", m) for m in reversed(range(num_micro))]
            for _ in range(num_stages)]


def one_f_one_b(num_stages: int, num_micro: int) -> list[list[tuple[str, int]]]:
    """PipeDream-flush 1F1B: K-s-1 warm-up forwards, then alternate, then drain backwards."""
    order = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_micro)
        ops = [("F", m) for m in range(warmup)]
        f, b = warmup, 0
        while f < num_micro:
            ops.append(("F", f))
            f += 1
            ops.append(("B", b))
            b += 1
        ops += [("B", m) for m in range(b, num_micro)]
        order.append(ops)
    return order


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def build(name: str, num_stages: int, num_micro: int) -> list[list[tuple[str, int]]]:
    if name not in SCHEDULES:
        raise SpecError(f"unknown schedule {name!r}", hint="gpipe or 1f1b")
    return SCHEDULES[name](num_stages, num_micro)


@dataclass
class Timeline:
    """When each (stage, op) ran, in clock cycles (or seconds, with per-stage costs)."""

    events: list[tuple[int, str, int, float, float]]  # (stage, kind, micro, start, end)
    num_stages: int

    @property
    def makespan(self) -> float:
        return max(end for *_, end in self.events)

    def busy(self, stage: int) -> float:
        return sum(end - start for s, _, _, start, end in self.events if s == stage)

    @property
    def bubble(self) -> float:
        """Idle fraction of the stage-time area."""
        area = self.num_stages * self.makespan
        return 1 - sum(self.busy(s) for s in range(self.num_stages)) / area

    def forward_cycles(self) -> float:
        return max(end for _, kind, _, _, end in self.events if kind == "F")

    def max_in_flight(self, stage: int) -> int:
        """Most micro-batches whose forward ran on `stage` but whose backward has not yet."""
        live, peak = 0, 0
        for s, kind, _, _, _ in sorted(self.events, key=lambda e: (e[3], e[1] == "F")):
            if s != stage:
                continue
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        return peak


def simulate(order: list[list[tuple[str, int]]], forward_cost=None, backward_cost=None) -> Timeline:
    """Run the per-stage orders with their dependencies; cost per op defaults to one cycle."""
    k = len(order)
    f_cost = forward_cost or [1.0] * k
    if backward_cost is not None:
        b_cost = backward_cost
    else:
        b_cost = [2.0 * c for c in f_cost] if forward_cost else [1.0] * k
    done: dict[tuple[str, int, int], float] = {}
    position = [0] * k
    free_at = [0.0] * k
    events = []
    remaining = sum(len(ops) for ops in order)
    while remaining:
        progressed = False
        for s in range(k):
            if position[s] == len(order[s]):
                continue
            kind, m = order[s][position[s]]
            deps = [("F", s - 1, m)] if kind == "F" and s > 0 else []
            if kind == "B":
                deps = [("F", s, m)] + ([("B", s + 1, m)] if s < k - 1 else [("F", s, m)])
            if all(d in done for d in deps):
                start = max([free_at[s]] + [done[d] for d in deps])
                end = start + (f_cost[s] if kind == "F" else b_cost[s])
                done[(kind, s, m)] = end
                free_at[s] = end
                events.append((s, kind, m, start, end))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise SpecError("the schedule deadlocks")
    return Timeline(events, k)
