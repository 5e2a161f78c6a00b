"""The house's rules, read from the source with `ast` (nothing of rlctl is imported but its location).

- no import cycle between files, and none between packages (imports inside functions count, and so
  do `if TYPE_CHECKING:` blocks: a circle the type checker follows still ties the files together,
  neither can be read, moved or tested without the other);
- each package imports only its own layer or lower (LAYERS); config and algorithms are leaves and
  runtime stays on the lowest floors (ONLY);
- no import of another package's private names (`_name`, a `_module`, or `module._name`);
- files <= 400 lines, functions <= 60 lines.

Each check is a function of a root folder (a package tree: `<root>/<package>/...`) that returns the
offenders as lines, so test_each_check_fails_on_a_planted_violation runs it on a planted tree.
A package is `<root>/<name>/` or a top-level module `<root>/<name>.py`; `<root>/__init__.py` is "__init__".
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

import rlctl

ROOT = Path(rlctl.__file__).parent
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60

# The layer map (docs/architecture.md says what each layer holds): a package imports
# its own layer or lower.
LAYERS = {
    "__init__": 0, "errors": 0, "utils": 0,
    "config": 1, "algorithms": 1, "sandbox": 1, "plugins": 1, "recipes": 1,
    "models": 2, "runtime": 2, "data": 2, "rollouts": 2,
    "multiturn": 3,
    "tasks": 4,
    "rewards": 5,
    "workers": 6,
    "checkpoint": 7, "api": 7, "agent": 7,
    "controller": 8, "validate": 8, "project": 8, "doctor": 8,
    "serve": 9, "view": 9, "tinker": 9,
    "cli": 10, "__main__": 10,
}
# Stricter than their layer: config and algorithms are leaves (algorithms: torch, numpy and the
# stdlib only, tests/algorithms/test_algorithms_leaf.py), runtime builds on L0/L1 alone.
ONLY = {
    "config": {"__init__", "errors", "utils"},
    "algorithms": set(),
    "runtime": {name for name, layer in LAYERS.items() if layer <= 1},
}
# Inside workers: four folders on four floors (docs/architecture.md, "Inside workers/"); a folder
# imports its own floor or lower, and every module sits in one of them.
WORKER_FLOORS = {"roles": 4, "rollout": 3, "compute": 2, "parallel": 1}


@dataclass(frozen=True)
class Import:
    source: str            # importing module, dotted ("rlctl.config.loader")
    target: str            # imported module (longest existing prefix of what the statement names)
    names: tuple           # names taken from it (empty for `import a.b`)
    line: int


@functools.lru_cache(maxsize=None)   # each root is read once per session (planted roots are new folders)
def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root (root's folder name is the top package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def package(module: str) -> str:
    """rlctl.config.loader -> config; rlctl.doctor -> doctor; rlctl -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node, module: str, is_init: bool, mods: dict) -> list[tuple[str, tuple]]:
    """(target module, names) of one import statement, only modules under root."""
    if isinstance(node, ast.Import):
        return [(t, ()) for alias in node.names if (t := _resolve(alias.name, mods))]
    base = node.module or ""
    if node.level:   # relative: from the importing file's package, `level - 1` packages up
        pkg = module.split(".") if is_init else module.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in mods:                      # `from pkg import submodule`
            out.append((sub, ()))
        elif (t := _resolve(base, mods)):
            out.append((t, (alias.name,)))
    return out


@functools.lru_cache(maxsize=None)
def imports(root: Path) -> tuple[Import, ...]:
    """Every import of a module under root, at any depth of every file (function bodies and
    `if TYPE_CHECKING:` blocks included)."""
    mods, out = modules(root), []

    def visit(node, module, is_init):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target, names in _targets(child, module, is_init, mods):
                    if target != module:
                        out.append(Import(module, target, names, child.lineno))
            visit(child, module, is_init)

    for module, path in mods.items():
        visit(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py")
    return tuple(out)


def _where(root: Path, module: str) -> str:
    """A module as the path a contributor opens: rlctl/config/loader.py."""
    return str(modules(root)[module].relative_to(root.parent))


def _edge(root: Path, imp: Import) -> str:
    names = f": {', '.join(imp.names)}" if imp.names else ""
    return f"{_where(root, imp.source)}:{imp.line} -> {_where(root, imp.target)}{names}"


def _cycles(graph: dict[str, set]) -> list[set]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = set(stack[stack.index(node):])
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def file_cycles(root: Path) -> list[str]:
    """Each file import cycle (TYPE_CHECKING imports count): its members, then every import between them."""
    edges = list(imports(root))
    graph: dict[str, set] = {}
    for imp in edges:
        graph.setdefault(imp.source, set()).add(imp.target)
    out = []
    for cycle in _cycles(graph):
        out.append("file cycle: " + ", ".join(_where(root, m) for m in sorted(cycle)))
        out += [f"  {_edge(root, i)}" for i in edges if i.source in cycle and i.target in cycle]
    return out


def package_cycles(root: Path) -> list[str]:
    """Each package import cycle (TYPE_CHECKING imports count): its packages, then every file import
    that makes one of its edges."""
    edges = [i for i in imports(root) if package(i.source) != package(i.target)]
    graph: dict[str, set] = {}
    for imp in edges:
        graph.setdefault(package(imp.source), set()).add(package(imp.target))
    out = []
    for cycle in _cycles(graph):
        out.append("package cycle: " + ", ".join(sorted(cycle)))
        out += [f"  {_edge(root, i)}" for i in edges if package(i.source) in cycle and package(i.target) in cycle]
    return out


def layer_violations(root: Path, layers: dict = LAYERS, only: dict = ONLY) -> list[str]:
    """Imports from a higher layer (or, for ONLY's packages, from outside their list), and
    packages the layer map does not place."""
    out = [f"package {p!r} ({_where(root, m)}) has no layer in LAYERS"
           for p, m in {package(m): m for m in modules(root)}.items() if p not in layers]
    for imp in imports(root):
        src, dst = package(imp.source), package(imp.target)
        if src == dst or src not in layers or dst not in layers:
            continue
        if src in only and dst not in only[src]:
            out.append(f"{src} may import only {sorted(only[src]) or 'itself'}: {_edge(root, imp)}")
        elif layers[dst] > layers[src]:
            out.append(f"{src} (L{layers[src]}) imports {dst} (L{layers[dst]}): {_edge(root, imp)}")
    return out


def worker_floor_violations(root: Path, floors: dict = WORKER_FLOORS) -> list[str]:
    """Modules of workers/ outside the folders of WORKER_FLOORS, and imports from a lower folder to a
    higher one."""
    top = root / "workers"

    def folder(module: str) -> str | None:
        rel = modules(root)[module].relative_to(root)
        return rel.parts[1] if rel.parts[0] == "workers" and len(rel.parts) > 2 else None

    out = [f"{_where(root, m)} is in no folder of WORKER_FLOORS" for m, path in modules(root).items()
           if path.is_relative_to(top) and path != top / "__init__.py" and folder(m) not in floors]
    for imp in imports(root):
        src, dst = folder(imp.source), folder(imp.target)
        if src in floors and dst in floors and floors[dst] > floors[src]:
            out.append(f"workers/{src} (floor {floors[src]}) imports workers/{dst} (floor {floors[dst]}): "
                       f"{_edge(root, imp)}")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """Another package's private names: `from x import _name`, a `_module`, or `module._name` where
    `module` was imported from another package."""
    mods, out = modules(root), []
    for imp in imports(root):
        if package(imp.source) == package(imp.target):
            continue
        private = [n for n in imp.names if _private(n)] + \
            [p for p in imp.target.split(".")[1:] if _private(p)]
        if private:
            out.append(f"private name of {package(imp.target)}: {_edge(root, imp)} ({', '.join(private)})")
    for module, path in mods.items():
        out += _private_attributes(root, module, ast.parse(path.read_text()), mods)
    return out


def _private_attributes(root: Path, module: str, tree: ast.Module, mods: dict) -> list[str]:
    """`alias._name` where `alias` is bound (anywhere in the file) to a module of another package."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in mods:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in mods:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return [f"private name of {package(bound[node.value.id])}: {_where(root, module)}:{node.lineno} -> "
            f"{_where(root, bound[node.value.id])}: {node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
            and _private(node.attr) and package(bound[node.value.id]) != package(module)]


def long_files(root: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    return [f"{_where(root, m)}: {n} lines (limit {limit})"
            for m, p in modules(root).items() if (n := len(p.read_text().splitlines())) > limit]


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (methods, nested ones too) from `def` to their last line, decorators excluded."""
    out = []
    for module, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{_where(root, module)}:{node.lineno} {node.name}: {n} lines (limit {limit})")
    return out


def _report(offenders: list[str], what: str) -> str:
    return f"{what}:\n" + "\n".join(offenders)


# --- the rules on rlctl/ ---------------------------------------------------------------------------
def test_no_file_import_cycles():
    assert not (found := file_cycles(ROOT)), _report(found, "file import cycles (break one import of each)")


def test_no_package_import_cycles():
    assert not (found := package_cycles(ROOT)), _report(found, "package import cycles (break one import of each)")


def test_packages_import_only_their_layer_or_lower():
    assert not (found := layer_violations(ROOT)), _report(found, "imports against the layer map (LAYERS, ONLY)")


def test_worker_folders_import_only_their_floor_or_lower():
    assert not (found := worker_floor_violations(ROOT)), _report(found, "imports against the workers' floors "
                                                                        "(WORKER_FLOORS)")


def test_no_private_names_across_packages():
    assert not (found := private_imports(ROOT)), _report(found, "private names used by another package "
                                                                "(make them public or move the caller)")


def test_files_are_short():
    assert not (found := long_files(ROOT)), _report(found, "files over the limit (split them)")


def test_functions_are_short():
    assert not (found := long_functions(ROOT)), _report(found, "functions over the limit (split them)")


def test_the_checks_see_the_whole_tree():
    """A moved root or a parser that skips files would make every check pass on nothing."""
    mods = modules(ROOT)
    assert {"rlctl.config.loader", "rlctl.workers.roles.actor", "rlctl.cli.main", "rlctl.doctor"} <= set(mods)
    assert len(mods) > 100 and len(imports(ROOT)) > 300


# --- each check fails on a planted violation ---------------------------------------------------------
def _function(name: str, lines: int) -> str:
    """A function `lines` long from `def` to its last line."""
    return f"def {name}():\n" + "    x = 0\n" * (lines - 2) + "    return x\n"


CLEAN = {   # obeys every rule, with the allowed look-alikes of each violation
    "__init__.py": '__version__ = "0"\n',
    "errors.py": "class RlctlError(Exception):\n    pass\n",
    "utils/__init__.py": "",
    "utils/fs.py": "def write():\n    pass\n" + "\n" * 397,                      # 400 lines
    "config/__init__.py": "",
    "config/schema.py": "from rlctl import __version__\nfrom rlctl.errors import RlctlError\nfrom ..utils import fs\n",
    "runtime/__init__.py": "from rlctl.runtime.batch import Batch\n",
    "runtime/batch.py": "from rlctl.config import schema\n\n\nclass Batch:\n    pass\n",
    "data/__init__.py": "",
    "data/a.py": "from . import b\nfrom .b import _inner\n",                     # private within data: fine
    "data/b.py": "def _inner():\n    from rlctl.models import m\n\n\ndef run():\n    pass\n",
    "models/__init__.py": "",
    "models/m.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:   # same layer, no circle\n"
                   "    from rlctl.runtime.batch import Batch\n\n\ndef _helper():\n    pass\n\n\n" + _function("ok", 60),
    "workers/__init__.py": "",
    "workers/roles/w.py": "from rlctl.data import a\nfrom rlctl.models import m\n\nm.ok()\n",
}

PLANTED = [   # (check, file added or replaced, its text, what the report must say)
    (file_cycles, "data/b.py", "def f():\n    from rlctl.data import a\n",
     "file cycle: rlctl/data/a.py, rlctl/data/b.py"),
    (file_cycles, "data/b.py", "def f():\n    from rlctl.data import a\n",
     "rlctl/data/b.py:2 -> rlctl/data/a.py"),
    (file_cycles, "data/b.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlctl.data.a import x\n",
     "file cycle: rlctl/data/a.py, rlctl/data/b.py"),                  # a circle only the type checker follows
    (package_cycles, "models/n.py", "def f():\n    from rlctl.data.b import run\n",
     "package cycle: data, models"),
    (package_cycles, "models/n.py", "def f():\n    from rlctl.data.b import run\n",
     "rlctl/models/n.py:2 -> rlctl/data/b.py: run"),
    (package_cycles, "models/n.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlctl.data.b import run\n",
     "package cycle: data, models"),
    (layer_violations, "data/c.py", "from rlctl.workers.roles.w import m\n",
     "data (L2) imports workers (L6): rlctl/data/c.py:1 -> rlctl/workers/roles/w.py: m"),
    (layer_violations, "config/schema.py", "def f():\n    from ..models import m\n",   # relative, in a function
     "config may import only ['__init__', 'errors', 'utils']: rlctl/config/schema.py:2 -> rlctl/models/m.py"),
    (layer_violations, "runtime/batch.py", "from rlctl.data import a\n",            # same layer, still not allowed
     "runtime may import only"),
    (layer_violations, "errors.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rlctl.workers\n",
     "errors (L0) imports workers (L6): rlctl/errors.py:3 -> rlctl/workers/__init__.py"),
    (layer_violations, "newpkg.py", "x = 1\n", "package 'newpkg' (rlctl/newpkg.py) has no layer in LAYERS"),
    (private_imports, "workers/roles/w.py", "from rlctl.models.m import _helper\n",
     "private name of models: rlctl/workers/roles/w.py:1 -> rlctl/models/m.py: _helper (_helper)"),
    (private_imports, "workers/roles/w.py", "from rlctl.models import m\n\n\ndef f():\n    m._helper()\n",
     "private name of models: rlctl/workers/roles/w.py:5 -> rlctl/models/m.py: _helper"),
    (private_imports, "workers/roles/w.py", "import rlctl.models._impl\n", "rlctl/models/_impl.py (_impl)"),
    (worker_floor_violations, "workers/parallel/p.py", "def f():\n    from rlctl.workers.roles.w import x\n",
     "workers/parallel (floor 1) imports workers/roles (floor 4): rlctl/workers/parallel/p.py:2 -> "
     "rlctl/workers/roles/w.py: x"),
    (worker_floor_violations, "workers/loose.py", "x = 1\n", "rlctl/workers/loose.py is in no folder of WORKER_FLOORS"),
    (long_files, "utils/fs.py", "x = 1\n" * 401, "rlctl/utils/fs.py: 401 lines (limit 400)"),
    (long_functions, "models/m.py", _function("too_long", 61), "rlctl/models/m.py:1 too_long: 61 lines (limit 60)"),
]
CHECKS = [file_cycles, package_cycles, layer_violations, worker_floor_violations, private_imports, long_files,
          long_functions]


def _plant(tmp_path: Path, files: dict) -> Path:
    root = tmp_path / "rlctl"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_clean_tree_passes_every_check(tmp_path):
    root = _plant(tmp_path, {**CLEAN, "models/_impl.py": ""})
    assert {check.__name__: check(root) for check in CHECKS} == {check.__name__: [] for check in CHECKS}


@pytest.mark.parametrize("check, rel, text, expected", PLANTED, ids=[f"{p[0].__name__}-{p[1]}" for p in PLANTED])
def test_each_check_fails_on_a_planted_violation(tmp_path, check, rel, text, expected):
    root = _plant(tmp_path, {**CLEAN, "models/_impl.py": "", rel: text})
    found = check(root)
    assert any(expected in line for line in found), "\n".join(found)
