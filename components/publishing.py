"""Atomic publishing of an artifact, and which attempt of a task may write it.

`publish` makes a failed or retried task leave nothing half-written that a reader would take for whole:
- on a local disk the executor writes into a private temporary sibling, renamed into place at the end;
- an object store has no rename, so the executor writes in place and a manifest of every file and its size is
  written last (`artifacts.PUBLISHED_FILE`); readers (`artifacts.require_published`) refuse an artifact without one.
  Each attempt first signs the folder as its writer: an attempt that another one has taken over since (its host cut
  off, its task retried elsewhere) neither publishes nor removes what the newer attempt wrote.
An attempt's temporary files go to a `scratch_space` beside the artifact, not into it. Attempts are ordered by when
they began: `attempt` gives that time to every `publish` and `scratch_space` of a component's outputs.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import glob
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from hpml.components import artifacts, files
from hpml.components.artifacts import PUBLISHED_FILE, WRITER_FILE
from hpml.components.errors import HpmlError, TakenOver

_TMP_MARKER = ".tmp-"
# {output URI: (writer id, when its attempt began)} for the artifacts this process is publishing on an object store.
_SIGNED: dict[str, tuple[str, float]] = {}
# {output URI: when the attempt writing it began}, while a component's attempt runs (`attempt`).
_BEGAN: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("hpml_attempt_began", default=None)


@contextlib.contextmanager
def attempt(outputs: Iterable[str | None], started_at: float) -> Iterator[float]:
    """While a component's attempt runs: `publish` and `scratch_space` of its `outputs` take `started_at` as the time
    the attempt began, so that one cut off for a while, and retried meanwhile, leaves its retry's work alone, however
    long after it began it publishes."""
    began = {**(_BEGAN.get() or {}), **{_key(uri): started_at for uri in outputs if uri}}
    token = _BEGAN.set(began)
    try:
        yield started_at
    finally:
        _BEGAN.reset(token)


def began(uri: str) -> float | None:
    """When the attempt writing the output at `uri` began, inside `attempt`; None elsewhere."""
    return (_BEGAN.get() or {}).get(_key(uri))


def _key(uri: str) -> str:
    return uri.rstrip("/") if files.is_url(uri) else os.path.abspath(uri)


def _clear_stale_temporaries(uri: str) -> None:
    parent, base = os.path.split(os.path.abspath(uri))
    for stale in glob.glob(os.path.join(parent, glob.escape(base) + _TMP_MARKER + "*")):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def publish(uri: str, started_at: float | None = None) -> Iterator[str]:
    """Yield the directory to write the artifact into; on success publish it whole.

    On a local disk that is a fresh temporary sibling, renamed to `uri` at the end; leftovers of an earlier failed
    attempt are removed first, and an earlier published output is replaced whole. On an object store it is `uri`
    itself, emptied first (an earlier attempt's files must not mix with this one's), with the manifest written last.
    `started_at`: when this attempt began (default: the time `attempt` gives its outputs); on an object store it
    fails, leaving the artifact alone, where an attempt that began later (its retry, while this one was cut off)
    published or writes it.
    """
    started_at = began(uri) if started_at is None else started_at
    if files.is_url(uri):
        if started_at is not None:
            _refuse_if_superseded(uri, started_at)
        started_at = time.time() if started_at is None else started_at
        files.rmtree(uri)
        files.makedirs(uri)
        writer_id = _sign(uri, started_at)
        _SIGNED[_key(uri)] = (writer_id, started_at)
        try:
            yield uri
        except BaseException as err:
            # Taken over, this attempt removes nothing: its signature may be back only because a request of its own,
            # held up while its host was cut off, landed after the later attempt signed.
            with contextlib.suppress(Exception):
                if not isinstance(err, TakenOver) and _writer(uri) == writer_id:
                    files.rmtree(uri)
            raise
        finally:
            _SIGNED.pop(_key(uri), None)
        _hold(uri, writer_id, started_at)
        written = {name: size for name, size in files.walk_files(uri) if name != WRITER_FILE}
        _refuse_gaps(uri, written, writer_id)
        files.remove(os.path.join(uri, WRITER_FILE))  # the published artifact is the files the manifest lists
        manifest = {"files": written, "started_at": started_at}
        files.write_text(os.path.join(uri, PUBLISHED_FILE), json.dumps(manifest, indent=1, sort_keys=True))
        return
    uri = os.path.abspath(uri)
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    _clear_stale_temporaries(uri)
    tmp = f"{uri}{_TMP_MARKER}{uuid.uuid4().hex[:12]}"
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(uri):
        trash = f"{uri}{_TMP_MARKER}old-{uuid.uuid4().hex[:12]}"
        os.rename(uri, trash)
        os.rename(tmp, uri)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, uri)


@contextlib.contextmanager
def scratch_space(uri: str, started_at: float | None = None) -> Iterator[str]:
    """Yield a folder beside the artifact at `uri`, on the same storage (so that workers on other hosts reach it),
    for one attempt's temporary files; removed when the attempt ends. Kept out of the artifact itself so that a
    cut-off attempt that writes on for a while cannot leave its temporaries inside what a newer attempt published.
    `started_at`: when this attempt began (default: the time `attempt` gives `uri`, else now), written into the
    folder's name. Scratch folders of
    attempts that began earlier are removed first (an attempt still writing into one then fails); where one that
    began later is there, this attempt was taken over while it was cut off, and ends (`TakenOver`)."""
    started_at = started_at if started_at is not None else began(uri) or time.time()
    parent, base = os.path.split(uri.rstrip("/"))
    prefix = f"{base}{_TMP_MARKER}scratch-"
    with contextlib.suppress(FileNotFoundError):
        for name in files.listdir(parent):
            if not name.startswith(prefix):
                continue
            if _scratch_started_at(name[len(prefix):]) > started_at:
                raise TakenOver(f"{uri}: an attempt of this task that began after this one is working on it "
                                f"({name}); this attempt leaves it to that one", hint=_TAKEN_OVER)
            _remove_scratch(f"{parent}/{name}" if files.is_url(parent) else os.path.join(parent, name))
    own = f"{prefix}{int(started_at * 1000):012x}-{uuid.uuid4().hex[:8]}"
    scratch = f"{parent}/{own}" if files.is_url(parent) else os.path.join(parent, own)
    files.makedirs(scratch)
    try:
        yield scratch
    finally:
        _remove_scratch(scratch)


def names_scratch(text: str) -> bool:
    """Whether `text` (an error's message) names a path in an attempt's scratch folder."""
    return f"{_TMP_MARKER}scratch-" in text


def _scratch_started_at(suffix: str) -> float:
    """When the attempt that named its scratch folder `<prefix><suffix>` began; 0 for a name without the time."""
    stamp, _, attempt_id = suffix.partition("-")
    try:
        return int(stamp, 16) / 1000 if attempt_id else 0.0
    except ValueError:
        return 0.0


def _remove_scratch(path: str, attempts: int = 5) -> None:
    """Remove a scratch folder; a late writer (a Beam worker finishing a bundle) can leave files behind the first
    removal, so try again before giving up loudly."""
    for _ in range(attempts):
        files.rmtree(path)
        if next(files.walk_files(path), None) is None:  # a listing: TF's gs:// client caches `exists` for 5 s
            return
        time.sleep(0.2)
    raise OSError(f"could not remove the scratch folder {path}")


def writer_fence(uri: str) -> Callable[[], None]:
    """A check to call before each write into the artifact being published at `uri`: it raises once another attempt
    has taken the artifact over, or published it. On a local disk each attempt writes into a folder of its own, so
    the check passes. Picklable, for Beam workers."""
    if not files.is_url(uri):
        return unfenced
    writer_id, started_at = _SIGNED.get(_key(uri)) or (_writer(uri), 0.0)
    return functools.partial(_hold, uri, writer_id, started_at)


def announce(uri: str, started_at: float) -> Callable[[], None]:
    """Sign the output at `uri`, on an object store, as written by the attempt that began at `started_at`, for an
    output made elsewhere and uploaded when the component ends (s3:// staging): an earlier attempt that comes back
    meanwhile then finds it (`superseded_check`, `publish`). Ends (TakenOver) where a later attempt signed or
    published it first. Returns what withdraws the signature, where it is still this attempt's."""
    _refuse_if_superseded(uri, started_at)
    writer_id = _sign(uri, started_at)

    def withdraw() -> None:
        with contextlib.suppress(OSError):
            if _writer(uri) == writer_id:
                files.remove(os.path.join(uri, WRITER_FILE))
    return withdraw


def superseded_check(uri: str) -> Callable[[], None]:
    """A check to call before a step whose effect outlives this attempt (a push, a registry version): it raises
    TakenOver once an attempt that began after this one (inside `attempt`) writes or has published the output at
    `uri` on an object store. Elsewhere it passes."""
    started_at = began(uri)
    if started_at is None or not files.is_url(uri):
        return unfenced
    return functools.partial(_refuse_if_superseded, uri, started_at)


def unfenced() -> None:
    """The check for a writer that owns its folder alone."""
    return None


_TAKEN_OVER = "an attempt whose host was cut off, or whose task was retried elsewhere, ends here"


def _hold(uri: str, writer_id: str | None, started_at: float) -> None:
    """Before each write into an artifact this attempt signed: `TakenOver` once a later attempt signed or published
    it. A signature that is gone, or an earlier attempt's, is made this attempt's again: a request of an attempt whose
    host was cut off (a signature, a removal) can land once the network is back, after the later attempt signed, and
    the artifact stays with the attempt that began last."""
    if _writer(uri) == writer_id:
        return
    if writer_id is None or _superseding(uri, started_at):
        raise TakenOver(f"{uri} was taken over by another attempt of this task while this one wrote it; this "
                        "attempt leaves it to that one", hint=_TAKEN_OVER)
    _sign(uri, started_at, writer_id)


def _refuse_gaps(uri: str, written: Iterable[str], writer_id: str) -> None:
    """Fail this attempt, removing what it wrote, where a series of shards it wrote lacks one: a removal that an
    earlier attempt sent before its host was cut off (emptying the artifact as it began) can land after this
    attempt wrote a shard of the same name. Its manifest would list what is left, and readers take that as whole."""
    missing = artifacts.missing_from_shard_series(written)
    if not missing:
        return
    with contextlib.suppress(Exception):
        if _writer(uri) == writer_id:
            files.rmtree(uri)
    raise HpmlError(f"{uri}: {len(missing)} shard(s) this attempt wrote are gone before it could publish them "
                    f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); the artifact is not published",
                    hint="a removal sent by an earlier attempt of this task, held up while its host was cut off, "
                         "can land late; the task's next try writes the artifact again")


def _refuse_if_superseded(uri: str, started_at: float) -> None:
    """`TakenOver` if an attempt that began after `started_at` published, or is writing, the artifact at `uri`."""
    doing = _superseding(uri, started_at)
    if doing:
        raise TakenOver(f"{uri}: an attempt of this task that began after this one {doing} it; this attempt "
                        "leaves it to that one", hint=_TAKEN_OVER)


def _superseding(uri: str, started_at: float) -> str | None:
    """What an attempt that began after `started_at` did to the artifact at `uri` ('published', 'is writing'), or
    None."""
    for name, doing in ((PUBLISHED_FILE, "published"), (WRITER_FILE, "is writing")):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads(files.read_text(os.path.join(uri, name))).get("started_at", 0) > started_at:
                return doing
    return None


def _sign(uri: str, started_at: float, writer_id: str | None = None) -> str:
    """Write the writer record of an attempt at `uri` (an object store's artifact): a new one, or `writer_id`'s
    again; its id."""
    writer_id = writer_id or uuid.uuid4().hex
    files.write_text(os.path.join(uri, WRITER_FILE), json.dumps(
        {"attempt": writer_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": started_at}))
    return writer_id


def _writer(uri: str) -> str | None:
    """The attempt that signed the artifact at `uri` as its writer, or None."""
    try:
        return json.loads(files.read_text(os.path.join(uri, WRITER_FILE))).get("attempt")
    except (OSError, ValueError):
        return None
