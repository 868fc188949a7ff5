"""Each knob's reason, in the numbers measured: what won, what the budget left out, what the probe predicted."""
from __future__ import annotations

from hpml.components.trainer.step_tuning import knobs
from hpml.components.trainer.step_tuning.knobs import FLOAT32, LONG_BUDGET_SHARE, LONG_TRAINING_S


def explain(tuning, choice, results, differences, skipped, budget, predicted, compile_s, why, savings,
             paid_back) -> None:
    """Each knob's reason, from what was measured, what the budget left out and what the matmul probe predicted."""
    base = results.get((False, FLOAT32))

    def probed(policy) -> str:
        if policy not in savings:
            return ""
        if any(key[1] == policy for key in paid_back):
            return (f"; measured past the budget: a probe of its matmuls predicted it to save about "
                    f"{savings[policy]:.1f} s of this training")
        return (f"; a probe of its matmuls predicts it to save about {max(savings[policy], 0.0):.1f} s, less than "
                "measuring it would cost")

    def versus(key) -> str:
        rate = results[key]
        return f"{rate:,.0f} examples/s" + (f", {rate / base:.2f}x float32 without XLA" if base else "")

    over_budget = (f"compiling a candidate (about {compile_s:.1f} s) would take measuring past its {budget:.1f} s "
                   f"budget, {_share(predicted)} of the {predicted:.0f} s this training should take")
    if "jit_compile" not in tuning.reasons:
        xla = [key for key in results if key[0]]
        if not xla:
            tuning.reasons["jit_compile"] = f"not measured: {over_budget}"
        elif choice.jit_compile:
            tuning.reasons["jit_compile"] = f"XLA: {versus((True, choice.precision))}"
        else:
            best = max(xla, key=results.get)
            tuning.reasons["jit_compile"] = f"off: with XLA, at best {versus(best)}"
    if "precision" not in tuning.reasons:
        policy = next((key[1] for key in list(results) + skipped if key[1] != FLOAT32), None)
        if policy is None:
            tuning.reasons["precision"] = "float32"
        elif policy not in differences:
            tuning.reasons["precision"] = f"float32: {policy} not measured: {over_budget}{probed(policy)}"
        elif differences[policy] > knobs.PRECISION_TOLERANCE:
            tuning.reasons["precision"] = (f"float32: {policy}'s loss differs by {differences[policy]:.1%} from "
                                           f"float32's on the same batches, over the {knobs.PRECISION_TOLERANCE:.0%} "
                                           "allowed")
        elif choice.precision == policy:
            tuning.reasons["precision"] = (f"{policy} ({why}): {versus((choice.jit_compile, policy))}, loss within "
                                           f"{differences[policy]:.2%} of float32's{probed(policy)}")
        else:
            best = max((key for key in results if key[1] == policy), key=results.get)
            tuning.reasons["precision"] = f"float32: {policy} ran at best {versus(best)}{probed(policy)}"


def _share(predicted_s: float) -> str:
    return f"{100 * (LONG_BUDGET_SHARE if predicted_s >= LONG_TRAINING_S else knobs.BUDGET_SHARE):.0f}%"
