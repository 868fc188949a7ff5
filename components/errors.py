"""Errors that reach users: one clear line naming the file, row or field, plus a hint."""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


# The exit status of a process stopped by a user error (bad input or parameters): the CLI's, and a
# Trainer worker's, which tells the launcher that a restart would fail the same way.
USER_ERROR_EXIT = 2


class HpmlError(Exception):
    """Base class for errors a user can act on; `hint` says what to do about it."""

    def __init__(self, message: str, hint: str | None = None):
        # The hint rides in args: Beam re-raises a DoFn's error as type(e)(args[0] + note, *args[1:]),
        # and pickling rebuilds it as type(e)(*args), so an attribute alone would be dropped on the way.
        super().__init__(message, hint)
        self.hint = hint

    def __str__(self) -> str:
        return self.args[0]


class InputDataError(HpmlError):
    """Raw or transformed data is malformed: names the file and the row or field."""


class SpecError(HpmlError):
    """A component parameter, pipeline parameter or artifact layout is invalid."""


class TakenOver(SpecError):
    """This attempt of a task was taken over by a later one (its retry, while this attempt was cut off): it ends,
    and leaves the artifacts and the run record to that one."""


class TrainingDiverged(HpmlError):
    """The loss became NaN or infinite: a restart from the last backup would diverge the same way."""


def op_error_message(err) -> str:
    """A TensorFlow op error's own words (`tf.errors.OpError.message`), without the `{{function_node ...}}`
    prefix and `[Op:...] name:` suffix that eager execution wraps them in."""
    return re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$", "", err.message.strip()).strip()


def known_names(what: str, name: str, known: Iterable[str]) -> str:
    """A hint for an unknown name: the known ones, led by the closest where `name` looks like a misspelling
    of it ("did you mean 'epochs'? known parameters: ...")."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    listed = f"known {what}: {', '.join(known)}"
    return f"did you mean {close[0]!r}? {listed}" if close else listed


def interruption(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C behind `err`: itself, or one it was raised while handling (a library whose clean-up failed on
    the way out: a database session, a half-written checkpoint). None where no Ctrl-C led to it."""
    found = _behind(err, KeyboardInterrupt)
    return found if isinstance(found, KeyboardInterrupt) else None


def taken_over(err: BaseException) -> TakenOver | None:
    """The `TakenOver` behind `err`: itself, or one that a library (Beam, running the writer's check) wrapped."""
    found = _behind(err, TakenOver)
    return found if isinstance(found, TakenOver) else None


def _behind(err: BaseException, kind: type) -> BaseException | None:
    """`err` or the first error of `kind` in the chain of errors it was raised from or while handling."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
