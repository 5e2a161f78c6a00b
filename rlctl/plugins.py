"""A project's own Python files, imported by path: reward functions and `algorithm.plugins`.

Plugins register estimators and policy losses (`rlctl.algorithms.register_estimator`, ...). They
are imported in the controller (validate, train, resume) and in every actor rank, since policy
losses run there. Each file is executed at most once per process, whichever asks first (a
`reward.py` that also registers an estimator may be listed in `algorithm.plugins`): a second
execution would register the same names again, which the registry rightly refuses.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rlctl.errors import ConfigError

_LOADED: dict[str, ModuleType] = {}


def import_file(path: Path) -> ModuleType:
    """Execute the .py file at `path` once per process (cached by resolved path) and return it.

    Its folder joins sys.path, so helper modules next to it import as in verl. Raises what the
    file raises; a failed import is not cached.
    """
    key = str(Path(path).resolve())
    if key in _LOADED:
        return _LOADED[key]
    folder = str(Path(key).parent)
    if folder not in sys.path:
        sys.path.append(folder)
    name = "rlctl_user_" + hashlib.sha1(key.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, key)
    if spec is None or spec.loader is None:
        raise ImportError(f"{key} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _LOADED[key] = module
    return module


def import_checked(path: Path, where: str, *, relative_to: str) -> ModuleType:
    """import_file, with every way it can fail as one ConfigError (exit 2) prefixed by `where`."""
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist",
                          hint=f"{relative_to} is resolved relative to the config file's folder")
    try:
        return import_file(path)
    except SyntaxError as e:
        raise ConfigError(f"{where}: syntax error in {path} line {e.lineno}: {e.msg}",
                          hint="fix the file and try again") from e
    except Exception as e:
        raise ConfigError(f"{where}: importing {path} failed: {type(e).__name__}: {e}",
                          hint="run `python <file>` to see the full error") from e


def import_plugins(paths, base: Path | None = None) -> None:
    """Import every `algorithm.plugins` file (relative paths from `base`, the config's folder).
    ConfigError (exit 2) naming the file when one is missing or fails to import."""
    for p in paths:
        path = Path(p) if base is None or Path(p).is_absolute() else Path(base) / p
        import_checked(path, "algorithm.plugins", relative_to="algorithm.plugins")
