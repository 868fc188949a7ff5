"""Trainer: calls a user's run_fn(fn_args) with TFX's FnArgs fields."""
from hpml.components.trainer.spec import TRAINER

__all__ = ["TRAINER"]
