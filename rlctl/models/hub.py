"""Where a model path points -- a local folder, the Hugging Face cache, or the hub -- decided fast.

Every command that takes a model (train / resume via `config validate`, `data inspect --model`,
`init --model`, `merge`) asks `resolve_model` first, before anything heavy starts. Why: with no
route to the hub and HF_HUB_OFFLINE unset, transformers retries each file for about 50 s and then
raises an OSError deep in a worker; a cached model even takes minutes to load that way. Here the
hub is probed once with a short timeout; when it cannot be reached and the model is cached, the
process (and the Ray workers, which inherit HF_HUB_OFFLINE) switch to offline mode and read the
cache without a single network call. Stdlib only at import: `rlctl --help` stays light.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import DataError

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub's reading of HF_HUB_OFFLINE
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
FIX_HINT = ("build a local model with `rlctl model tiny models/tiny` (add `--arch qwen2_5_vl` for a vision-language "
            "recipe, `--arch qwen3_moe` for a mixture-of-experts one) and set model.path = \"models/tiny\", "
            "point model.path at a local model folder, or go online ({online}) to download it into the cache")


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class HubStatus:
    state: str  # "offline-mode" | "reachable" | "unreachable"
    endpoint: str
    detail: str = ""  # why unreachable

    def describe(self) -> str:
        if self.state == "offline-mode":
            return "offline mode (HF_HUB_OFFLINE=1): only local folders and cached models"
        if self.state == "reachable":
            return f"reachable ({self.endpoint})"
        return f"unreachable ({self.endpoint}: {self.detail})"


def probe_hub(timeout_s: float = PROBE_TIMEOUT_S) -> HubStatus:
    """Is the hub at HF_ENDPOINT answering? One HEAD request, at most `timeout_s` seconds."""
    if offline_mode():
        return HubStatus("offline-mode", hub_endpoint())
    return _probe(hub_endpoint(), timeout_s)


@functools.lru_cache(maxsize=8)  # one probe per endpoint per process: validate, then train, ask again
def _probe(endpoint: str, timeout_s: float) -> HubStatus:
    request = urllib.request.Request(endpoint + "/", method="HEAD", headers={"User-Agent": "rlctl"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        pass  # any HTTP answer (even 404/405) means a server is there
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        text = "timed out" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else str(reason)
        return HubStatus("unreachable", endpoint, text[:120] or type(e).__name__)
    return HubStatus("reachable", endpoint)


def go_offline() -> None:
    """From now on read the hub cache only: this process and every Ray worker started later."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import sys

    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read at its import; transformers asks huggingface_hub
        constants.HF_HUB_OFFLINE = True


def looks_local(path: str, base: Path | None = None) -> bool:
    """A path rather than a hub id: spelt like a path ("./m", "/m", "~/m"), or it exists relative to
    `base` (the config file's folder; the working directory when None). "org/name" may be either."""
    p = Path(path).expanduser()
    if path.startswith((".", "/", "~")):
        return True
    return (p if base is None or p.is_absolute() else base / p).exists()


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of `repo_id` (config.json and weights present), without network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a valid repo id, no hub library: not cached
        return None
    if not isinstance(hit, str):
        return None
    folder = Path(hit).parent
    return folder if any((folder / name).is_file() for name in WEIGHT_FILES) else None


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what to pass to from_pretrained: a folder or the hub id
    folder: Path | None  # where the files are now (None: on the hub, downloaded when loaded)
    where: str  # "local" | "cache" | "hub"
    note: str = ""  # something the user should know (the hub was unreachable, we went offline)


def resolve_model(path: str, base: Path | None = None, *, key: str = "model.path",
                  timeout_s: float = PROBE_TIMEOUT_S) -> ModelSource:
    """Find `path`: a local folder, a cached hub id, or a hub id to download; DataError if none works.

    No network call when the path is local or HF_HUB_OFFLINE is set; otherwise one probe of at most
    `timeout_s`. A cached id with the hub unreachable switches this process to offline mode.
    """
    if not path:
        raise DataError(f"{key} is empty", hint="set it to a local model folder or a Hugging Face model id")
    if looks_local(path, base):
        p = Path(path).expanduser()
        folder = p if p.is_absolute() or base is None else base / p
        if not folder.is_dir():
            raise DataError(f"{key} {path!r} is not a folder (looked at {folder})",
                            hint="fix the path, or build one with `rlctl model tiny models/tiny`")
        return ModelSource(str(folder), folder, "local")
    cached = cached_snapshot(path)
    hub = probe_hub(timeout_s)
    if hub.state == "reachable":
        return ModelSource(path, cached, "hub")
    if cached is not None:
        if hub.state == "unreachable":
            go_offline()
            return ModelSource(path, cached, "cache", note=f"the hub is {hub.describe()}; using the cached "
                                                           f"copy of {path} offline")
        return ModelSource(path, cached, "cache")
    offline = hub.state == "offline-mode"
    why = "HF_HUB_OFFLINE is set" if offline else f"the hub is {hub.describe()}"
    online = "unset HF_HUB_OFFLINE" if offline else "a network that reaches the hub, or HF_ENDPOINT for a mirror"
    raise DataError(f"{key} {path!r} is neither a local folder nor in the Hugging Face cache, and {why}",
                    hint=FIX_HINT.format(online=online))
