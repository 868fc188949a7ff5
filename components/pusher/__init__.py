"""Pusher: a blessed Model published as the next version of a serving destination in TF Serving's layout."""
from hpml.components.pusher.spec import PUSHER

__all__ = ["PUSHER"]
