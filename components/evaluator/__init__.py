"""Evaluator: every Model (and ensembles of them) scored on the same raw eval split, as one table."""
from hpml.components.evaluator.spec import EVALUATOR

__all__ = ["EVALUATOR"]
