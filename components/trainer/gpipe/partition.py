"""Split a sequence of layer costs into K contiguous stages, minimising the largest stage cost."""
from __future__ import annotations

from hpml.components.errors import SpecError


def block_partition(costs: list[float], k: int) -> list[list[int]]:
    """Indices of each stage, contiguous, with the smallest possible maximum stage cost.

    Dynamic programming over prefixes, O(n^2 k); ties prefer earlier, larger stages, so
    [1, 2, 3, 4, 5, 6] over 2 stages gives [[0, 1, 2, 3], [4, 5]] (costs 10 and 11).
    """
    n = len(costs)
    if k < 1 or k > n:
        raise SpecError(f"cannot split {n} layers into {k} stages")
    prefix = [0.0]
    for c in costs:
        if c < 0:
            raise SpecError("layer costs must be non-negative")
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: minimal max cost splitting the first i layers into j stages; cut[j][i] the last cut.
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for c in range(i - 1, j - 2, -1):  # last stage is layers c..i-1, never empty
                value = max(best[j - 1][c], prefix[i] - prefix[c])
                if value < best[j][i]:
                    best[j][i], cut[j][i] = value, c
    stages, i = [], n
    for j in range(k, 0, -1):
        c = cut[j][i]
        stages.append(list(range(c, i)))
        i = c
    return stages[::-1]


def counts_to_stages(counts: list[int], n: int) -> list[list[int]]:
    """An explicit balance (layers per stage) as stage index lists."""
    if sum(counts) != n or any(c < 1 for c in counts):
        raise SpecError(f"balance {counts} must be positive counts summing to {n} layers")
    stages, start = [], 0
    for c in counts:
        stages.append(list(range(start, start + c)))
        start += c
    return stages
