"""Text templates hpml fills in: the files `hpml init` writes (`*.tmpl` here) and the Report view's page.

A placeholder is `@NAME@` (capitals and underscores). `fill` replaces them all in one pass.
"""
from __future__ import annotations

import re
from importlib import resources

_PLACEHOLDER = re.compile(r"@([A-Z][A-Z_]*)@")


def fill(template: str, values: dict[str, str]) -> str:
    """The template with each `@NAME@` in `values` replaced in one pass: a value is never searched for placeholders,
    so user text in one (a run id, a column name) cannot pull another's content into it. Others stay as they are."""
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)


def render(name: str, values: dict[str, str]) -> str:
    """The template file `name` of this package, filled with `values`."""
    return fill(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"), values)
