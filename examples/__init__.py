"""Example pipelines that ship with hpml, each a pipeline definition plus a user module, built only on `hpml.v1`.

Copy one to start your own, or let `hpml init` write one for your CSV.
"""
