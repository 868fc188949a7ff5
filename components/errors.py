"""Errors that reach users: one clear line naming the file, row or field, plus a hint."""
from __future__ import annotations


class HpmlError(Exception):
    """Base class for errors a user can act on; `hint` says what to do about it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        return self.args[0]


class InputDataError(HpmlError):
    """Raw or transformed data is malformed: names the file and the row or field."""


class SpecError(HpmlError):
    """A component parameter, pipeline parameter or artifact layout is invalid."""
