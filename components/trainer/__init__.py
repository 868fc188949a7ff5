"""Trainer: calls a user's run_fn(fn_args) with TFX's FnArgs fields."""
from components.trainer.spec import TRAINER

__all__ = ["TRAINER"]
