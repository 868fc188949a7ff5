"""Load a user's function from a dotted module name or a .py file, as TFX's module_file does."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable

from hpml.components.errors import SpecError

# The name prefix of every module loaded from a file: `hpml_user_{stem}_{digest}`.
FILE_MODULE_PREFIX = "hpml_user_"


def load_file(path: str, what: str = "user module"):
    """The module a .py file defines, loaded by path as TFX loads a module_file.

    Keyed by path and content, as TFX keys module files: an edited file is loaded afresh in a long-lived
    process (a notebook, a test session, Airflow's dag-processor) instead of the stale copy being reused.
    """
    if not os.path.isfile(path):
        raise SpecError(f"{what} file {path} does not exist")
    path = os.path.abspath(path)
    with open(path, "rb") as handle:
        digest = hashlib.sha256(path.encode() + b"\0" + handle.read()).hexdigest()[:10]
    stem = os.path.splitext(os.path.basename(path))[0]
    mod_name = f"{FILE_MODULE_PREFIX}{stem}_{digest}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"{what} {path} is not a Python source file", hint="name a .py file")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except Exception as err:
            del sys.modules[mod_name]  # a half-run module must not pass for a loaded one next time
            where = f"{path}:{err.lineno}" if isinstance(err, SyntaxError) else path
            raise SpecError(f"{what} {where} failed to load: {type(err).__name__}: {err}") from err
    return sys.modules[mod_name]


def load_function(module: str, name: str) -> Callable:
    """`module` is 'pkg.mod' or a path to a .py file; `name` a function defined in it."""
    if module.endswith(".py"):
        loaded = load_file(module)
    else:
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as err:
            raise SpecError(f"cannot import user module {module!r} ({err})") from None
    fn = getattr(loaded, name, None)
    if not callable(fn):
        raise SpecError(f"user module {module!r} has no function {name!r}")
    return fn


def failing_line(err: BaseException, fn: Callable) -> str:
    """Where in `fn`'s own file `err` was raised, as 'file.py:LINE' (the deepest such frame: the user's
    line, not the library call it made); the file alone when no frame of the traceback is in it."""
    code = getattr(fn, "__code__", None)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    filename = code.co_filename if code else getattr(module, "__file__", None) or "?"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == filename]
    return f"{filename}:{frames[-1].lineno}" if frames else filename
