"""Load a user's function from a dotted module name or a .py file, as TFX's module_file does."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Callable

from components.errors import SpecError


def load_function(module: str, name: str) -> Callable:
    """`module` is 'pkg.mod' or a path to a .py file; `name` a function defined in it."""
    if module.endswith(".py"):
        if not os.path.isfile(module):
            raise SpecError(f"module file {module} does not exist")
        digest = hashlib.sha256(os.path.abspath(module).encode()).hexdigest()[:10]
        mod_name = f"hpml_user_{os.path.splitext(os.path.basename(module))[0]}_{digest}"
        if mod_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(mod_name, module)
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = loaded
            spec.loader.exec_module(loaded)
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
