"""SoftTargets: a Beam pass that runs frozen teachers once and caches their soft targets in the examples."""
from hpml.components.soft_targets.spec import SOFT_TARGETS

__all__ = ["SOFT_TARGETS"]
