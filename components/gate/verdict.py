"""The gate's verdict, metric by metric: the candidate against absolute thresholds, and against the champion
within a margin. With no champion, the thresholds alone decide."""
from __future__ import annotations

from collections.abc import Mapping

from hpml.components.gate.scoring import HIGHER_IS_BETTER


def check_metric(metric: str, candidate: float, champion: float | None, threshold: float | None,
                 margin: float | None) -> dict:
    """One metric's line: the values compared, whether the candidate passed, and why in words."""
    higher = HIGHER_IS_BETTER[metric]
    at_least, word = (">=", "at least") if higher else ("<=", "at most")
    problems: list[str] = []
    passes: list[str] = []
    if threshold is not None:
        ok = candidate >= threshold if higher else candidate <= threshold
        (passes if ok else problems).append(f"threshold {threshold:.4g}")
    if margin is not None and champion is not None:
        bound = champion - margin if higher else champion + margin
        ok = candidate >= bound if higher else candidate <= bound
        (passes if ok else problems).append(f"champion {champion:.4g} {'-' if higher else '+'} margin {margin:.4g}")
    if problems:
        reason = f"{metric} {candidate:.4g} is not {word} " + " nor ".join(problems)
    elif passes:
        reason = f"{metric} {candidate:.4g} {at_least} " + " and ".join(passes)
    else:
        reason = f"{metric} {candidate:.4g}: no champion to compare with"
    return {"metric": metric, "candidate": candidate, "champion": champion, "threshold": threshold,
            "margin": margin, "higher_is_better": higher, "passed": not problems, "reason": reason}


def verdict(candidate: Mapping[str, float], champion: Mapping[str, float] | None,
            thresholds: Mapping[str, float], margins: Mapping[str, float]) -> list[dict]:
    """Every metric named by a threshold or a margin, in a stable order."""
    return [check_metric(metric, candidate[metric], champion[metric] if champion else None,
                         thresholds.get(metric), margins.get(metric))
            for metric in sorted(set(thresholds) | set(margins))]
