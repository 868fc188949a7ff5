"""Pipeline definitions, the local runner, run records and the `hpml` command line."""
