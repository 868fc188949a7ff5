"""Run measurements on a model without changing it: weights, optimizer state, metrics and the train counter
are put back afterwards."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def restored_afterwards(model):
    """Training steps taken inside the block (to time or trace them) leave no trace on the model.

    The train counter counts too: mid-fit, BackupAndRestore checkpoints it to find the batch a resumed run starts
    at, and TensorBoard writes its summaries at it.
    """
    saved = [v.numpy() for v in model.variables]
    optimizer_state = [v.numpy() for v in model.optimizer.variables()]
    counter = getattr(model, "_train_counter", None)
    steps = None if counter is None else counter.numpy()
    try:
        yield model
    finally:
        for variable, value in zip(model.variables, saved):
            variable.assign(value)
        for variable, value in zip(model.optimizer.variables(), optimizer_state):
            variable.assign(value)
        if counter is not None:
            counter.assign(steps)
        model.reset_metrics()
