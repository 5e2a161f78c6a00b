"""Built-in recipes (recipes/*.toml) and project templates (templates/).

Both folders live at the top of the repository and ship inside the wheel as
rlctl/_bundled/{recipes,templates} (symlinks in the source tree, real files in the wheel).
A recipe's header comments carry its description (`# recipe:`), paper and data command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UsageError

_HERE = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """recipes/ or templates/: inside the installed package, else at the repository top."""
    for candidate in (_HERE / "_bundled" / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise UsageError(f"rlctl's {name}/ folder is missing from this installation",
                     hint="reinstall rlctl (pip install --force-reinstall rlctl).")


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    description: str
    paper: str
    data_command: str
    algorithm: str

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def _header(text: str, key: str) -> str:
    m = re.search(rf"^#\s*{key}:\s*(.+)$", text, flags=re.MULTILINE)
    return m.group(1).strip() if m else ""


def load_recipe(path: Path) -> Recipe:
    text = path.read_text(encoding="utf-8")
    algo = re.search(r'^\[algorithm\][^\[]*?^name\s*=\s*"([^"]+)"', text, flags=re.MULTILINE | re.DOTALL)
    sft = re.search(r'^\[run\][^\[]*?^kind\s*=\s*"sft"', text, flags=re.MULTILINE | re.DOTALL)
    return Recipe(name=path.stem, path=path, description=_header(text, "recipe"), paper=_header(text, "paper"),
                  data_command=_header(text, "data"), algorithm="sft" if sft else (algo.group(1) if algo else ""))


def model_command(recipe_text: str, path: str) -> str:
    """The `rlctl model tiny|get ... PATH` command a recipe's comments give for writing its
    model.path `path` (with the arguments it needs, such as `--arch qwen3_moe`); "" when none does."""
    for m in re.finditer(r"rlctl model (?:tiny|get) [^`\n&;,()]*", recipe_text):
        words = [w.rstrip(".") for w in m.group(0).split()]
        if path in words:
            return " ".join(words)
    return ""


def list_recipes() -> list[Recipe]:
    return [load_recipe(p) for p in sorted(bundled_dir("recipes").glob("*.toml"))]


def get_recipe(name: str) -> Recipe:
    recipes = {r.name: r for r in list_recipes()}
    if name not in recipes:
        import difflib

        close = difflib.get_close_matches(name, recipes, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown recipe {name!r}",
                         hint=f"{hint}`rlctl recipes list` shows the {len(recipes)} built-in recipes.")
    return recipes[name]
