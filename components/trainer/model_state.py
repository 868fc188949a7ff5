"""Run measurements on a trained model without changing it: weights, optimizer state and metrics
are put back afterwards."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def restored_afterwards(model):
    """Training steps taken inside the block (to time or trace them) leave no trace on the model."""
    saved = [v.numpy() for v in model.variables]
    optimizer_state = [v.numpy() for v in model.optimizer.variables()]
    try:
        yield model
    finally:
        for variable, value in zip(model.variables, saved):
            variable.assign(value)
        for variable, value in zip(model.optimizer.variables(), optimizer_state):
            variable.assign(value)
        model.reset_metrics()
