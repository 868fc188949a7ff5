"""Pipeline definitions, the local runner, run records and the `hpml` command line."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
