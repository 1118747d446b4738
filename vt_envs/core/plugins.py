"""User code by name: modules that register envs, tools or algorithms, and
``"module:attr"`` references, imported the same way by ``vt_envs``, ``vt-train``
and ``vt-bench``.

A plugin is a module name (``my_pkg.envs``) or a Python file
(``./my_ext.py``). Importing it runs its ``register_env`` /
``@register_advantage`` calls, so every registry that is read afterwards knows
its names. Module names are looked up on ``sys.path`` and then in the current
directory (as ``python -m`` would), so a module beside a recipe works from a
console script too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from vt_envs.errors import InvalidConfigError

__all__ = ["add_import_argument", "import_plugin", "import_plugins", "load_attr"]


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def import_plugin(spec: str) -> tuple[ModuleType, str]:
    """Import one plugin; returns the module and the spec to record (a file's absolute
    path, so a resumed run finds it from any directory).

    Raises:
        InvalidConfigError: the file does not exist, or no module has that name.
    """
    if _is_file(spec):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise InvalidConfigError(
                f"plugin file {spec!r} does not exist (resolved to {path}); give a module "
                "name on sys.path or the path of a .py file"
            )
        # One module per file, named after its path, so importing it twice is a no-op.
        name = f"vt_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name], str(path)
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module, str(path)
    top, cwd = spec.split(".")[0], os.getcwd()
    try:
        return importlib.import_module(spec), spec
    except ModuleNotFoundError as error:
        if error.name != top:
            raise  # the plugin itself failed on an import of its own: show that
    if cwd not in sys.path:  # as `python -m` would: the current directory
        sys.path.append(cwd)
        try:
            return importlib.import_module(spec), spec
        except ModuleNotFoundError as error:
            sys.path.remove(cwd)
            if error.name != top:
                raise
    raise InvalidConfigError(
        f"cannot import plugin {spec!r}: no module of that name on sys.path or in {cwd}; "
        "install it, add its directory to PYTHONPATH, or give its .py file's path"
    )


def import_plugins(specs: Iterable[str]) -> list[str]:
    """Import each plugin in order; returns the specs to record."""
    if isinstance(specs, str):
        raise InvalidConfigError(f"imports must be a list of modules or files, got {specs!r}")
    return [import_plugin(str(spec))[1] for spec in specs]


def add_import_argument(parser: Any, registers: str) -> None:
    """Add the repeatable ``--import MODULE`` option (into ``args.imports``) to an
    argparse parser; ``registers`` says what the user's module may register."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"a module or .py file to import first (registers {registers}); repeatable",
    )


def load_attr(reference: str) -> Any:
    """The object ``"module:attr"`` (or ``"path/to/file.py:attr"``) names.

    Raises:
        InvalidConfigError: not of that form, or the module has no such attribute.
    """
    module_spec, sep, attr = reference.rpartition(":")
    if not sep or not module_spec or not attr:
        raise InvalidConfigError(f"expected 'module:attr', got {reference!r}")
    module, _ = import_plugin(module_spec)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidConfigError(f"{module_spec!r} has no attribute {attr!r} ({reference!r})")
        obj = getattr(obj, part)
    return obj
