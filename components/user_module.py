"""Load a user's function from a dotted module name or a .py file, as TFX's module_file does."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from typing import Callable

from components.errors import SpecError


def load_function(module: str, name: str) -> Callable:
    """`module` is 'pkg.mod' or a path to a .py file; `name` a function defined in it."""
    if module.endswith(".py"):
        if not os.path.isfile(module):
            raise SpecError(f"module file {module} does not exist")
        # Keyed by path and content, as TFX keys module files: an edited file is loaded afresh in a
        # long-lived process (a notebook, a test session) instead of the stale copy being reused.
        with open(module, "rb") as handle:
            digest = hashlib.sha256(os.path.abspath(module).encode() + b"\0" + handle.read()).hexdigest()[:10]
        mod_name = f"hpml_user_{os.path.splitext(os.path.basename(module))[0]}_{digest}"
        if mod_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(mod_name, module)
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = loaded
            try:
                spec.loader.exec_module(loaded)
            except Exception as err:
                del sys.modules[mod_name]  # a half-run module must not pass for a loaded one next time
                where = f"{module}:{err.lineno}" if isinstance(err, SyntaxError) else module
                raise SpecError(f"user module {where} failed to load: {type(err).__name__}: {err}") from err
        loaded = sys.modules[mod_name]
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
