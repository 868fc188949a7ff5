"""The knobs of a training step and what decides them without measuring: the choice and its record, the device,
the precisions worth measuring on it, and how much measuring may cost."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hpml.components.artifacts import TUNED_STEP_FILE  # noqa: F401 - where it is defined
MAX_STEPS_PER_EXECUTION = 64
BURST_S = 0.03  # a timed burst of one candidate lasts at least this long
MIN_SWEEP_S = 0.25  # the steps_per_execution sweep may always take this long, however short the training
WITHIN = 0.03  # a smaller steps_per_execution this close to the fastest is preferred
# A value whose own best burst is this much slower than another value's is slower, whatever the fit says: the fit
# smooths noise, it must not overrule a gap wider than the noise (best-of-two bursts here vary by about a tenth).
BURST_NOISE = 0.15
# What tf_keras's fit adds to every call of the train function (callback hooks, its step bookkeeping), which bursts
# calling the function directly do not pay: 0.5 ms measured with tf_keras 2.21 on this project's 2-core machines.
# Left out, the fit of the bursts put 32 steps per call within 3% of 64 where fit ran 64 7-20% faster.
FIT_CALL_S = 0.0005
PRECISION_TOLERANCE = 0.02  # relative difference of the loss on the same batches, against float32
BUDGET_SHARE, LONG_BUDGET_SHARE, LONG_TRAINING_S = 0.10, 0.05, 600.0
PAYBACK = 1.0  # a policy measured past the budget must be predicted to save this many times what measuring costs
FLOAT32, MIXED_BFLOAT16, MIXED_FLOAT16 = "float32", "mixed_bfloat16", "mixed_float16"
KNOBS = ("steps_per_execution", "jit_compile", "precision")


@dataclass(frozen=True)
class StepChoice:
    steps_per_execution: int = 1
    jit_compile: bool = False
    precision: str = FLOAT32

    def describe(self) -> str:
        return (f"steps_per_execution={self.steps_per_execution}, XLA {'on' if self.jit_compile else 'off'}, "
                f"{self.precision}")


@dataclass
class StepTuning:
    """The choice, each measurement (examples/s), why each knob is what it is, and what measuring cost."""

    choice: StepChoice
    measured: list[dict] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    reused: bool = False
    trace_s: float = 0.0  # of `seconds`, tracing the training step, which fit then reuses

    def to_dict(self) -> dict:
        return {"choice": asdict(self.choice), "measured": self.measured, "reasons": self.reasons,
                "seconds": self.seconds, "reused": self.reused, "trace_s": self.trace_s}

    @staticmethod
    def from_dict(data: dict) -> StepTuning:
        return StepTuning(StepChoice(**data["choice"]), data.get("measured", []), data.get("reasons", {}),
                          data.get("seconds", 0.0), data.get("reused", False), data.get("trace_s", 0.0))


@dataclass(frozen=True)
class Device:
    """What decides which precisions are worth measuring: the device kind, a GPU's compute capability, and whether
    the CPU has bfloat16 instructions (AVX512_BF16 or AMX_BF16)."""

    kind: str = "CPU"  # "CPU", "GPU" or "TPU"
    compute_capability: tuple[int, int] | None = None
    cpu_bf16: bool = False

    def describe(self) -> str:
        if self.kind == "GPU":
            return f"GPU (compute capability {'.'.join(map(str, self.compute_capability or ()))})"
        return f"{self.kind}{' with bfloat16 instructions' if self.kind == 'CPU' and self.cpu_bf16 else ''}"


def candidate_precisions(device: Device) -> tuple[list[str], str]:
    """The policies worth measuring on this device beside float32, and why."""
    if device.kind == "TPU":
        return [MIXED_BFLOAT16], "a TPU computes in bfloat16 natively"
    if device.kind == "GPU":
        if device.compute_capability and device.compute_capability >= (7, 0):
            return [MIXED_FLOAT16], "a GPU with tensor cores (compute capability 7.0 or more) runs float16 fast"
        return [], "this GPU has no tensor cores (compute capability under 7.0): float16 would not be faster"
    if device.cpu_bf16:
        return [MIXED_BFLOAT16], "the CPU has bfloat16 instructions (AVX512_BF16 or AMX)"
    return [], "the CPU has no bfloat16 instructions: a mixed policy would only add casts"


def measure_budget_s(predicted_training_s: float) -> float:
    """How long measuring the costly candidates may take: a share of the training time the rate predicts."""
    share = LONG_BUDGET_SHARE if predicted_training_s >= LONG_TRAINING_S else BUDGET_SHARE
    return share * predicted_training_s


def pays_back(predicted_training_s: float, predicted_saving_s: float, cost_s: float) -> bool:
    """Whether a policy the budget leaves out is still worth measuring: training under 10 minutes (long training keeps
    its 5%) that a probe predicts it to shorten by at least PAYBACK times what measuring it costs."""
    return predicted_training_s < LONG_TRAINING_S and predicted_saving_s >= PAYBACK * cost_s


def compute_dtype(policy: str) -> str:
    return {MIXED_BFLOAT16: "bfloat16", MIXED_FLOAT16: "float16"}.get(policy, "float32")
