"""The eval split's metrics once training is over, without a second pass where fit already made one.

Fit validates at the end of every epoch, on the weights the epoch ended with; the final epoch's validation therefore
ran on the model that is exported, over the same data and steps, and its numbers are the eval metrics. Only where
fit validated nothing final (a ParameterServer run, a run resumed after its last epoch, no validation data) does
`final_eval_metrics` run `model.evaluate`.
"""
from __future__ import annotations


def validated_in_fit(model, history) -> dict[str, float] | None:
    """The final epoch's validation metrics from fit's History, by the names model.evaluate gives them, or None
    where fit's last epoch is not the run's last or did not validate every metric."""
    if history is None or not history.epoch:
        return None
    epochs = (history.params or {}).get("epochs")
    if epochs is None or history.epoch[-1] != epochs - 1:
        return None
    names = list(model.metrics_names)
    series = [history.history.get(f"val_{name}") for name in names]
    if not names or any(values is None or len(values) != len(history.epoch) for values in series):
        return None
    return {name: float(values[-1]) for name, values in zip(names, series)}


def final_eval_metrics(model, dataset, steps: int | None = None, history=None) -> dict[str, float]:
    """The eval split's metrics for the trained `model`: fit's validation of the final epoch where `history`
    (what fit returned) holds one, else one pass of model.evaluate over `steps` batches of `dataset`."""
    validated = validated_in_fit(model, history)
    if validated is not None:
        return validated
    results = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
    return {name: float(value) for name, value in results.items()}
