"""Gate: the candidate Model checked against thresholds and the champion; a ModelBlessing in TFX's layout."""
from hpml.components.gate.spec import GATE

__all__ = ["GATE"]
