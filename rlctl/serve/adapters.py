"""The LoRA adapters a server holds by name: `rlctl serve BASE --lora NAME=DIR` and vLLM's
/v1/load_lora_adapter, /v1/unload_lora_adapter.

`parse_lora_args` and `check_adapters` run before either engine starts (one line, exit 2 for usage,
3 for an adapter that does not fit the base); `ServedAdapters` is the built-in engine's table of
name -> slot over one rlctl.models.lora_slots.LoraSlots. Its `add`/`remove` run on the engine's
scheduler thread (Engine.load_adapter), between two decode steps, so a slot never changes under
a running row; a slot freed by an unload is reused only once no queued or running row holds it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlctl.api.api_error import APIError
from rlctl.errors import DataError, UsageError
from rlctl.models.lora_adapter import VLLM_RANKS, LoraAdapter, check_fits, read_adapter, vllm_rank

DEFAULT_SLOTS = 4
LORA_ENGINES = ("hf", "vllm")


def lora_plan(engine: str, values: list[str], base_folder: Path, base_name: str, *, run_adapter=None,
              max_loras: int | None = None, max_rank: int | None = None) -> dict | None:
    """What to serve: {"adapters": [(name, folder)], "slots", "max_rank"}, or None without LoRA.
    `run_adapter`: (run name, folder) of a LoRA run folder. Everything a user can get wrong is
    refused here, before the engine starts: exit 2 for usage, 3 for an adapter that cannot be served."""
    specs = parse_lora_args(values + ([f"{run_adapter[0]}={run_adapter[1]}"] if run_adapter else []), base_name)
    if not specs and max_loras is None:
        if max_rank is not None:
            raise UsageError("--max-lora-rank applies only with --lora or --max-loras")
        return None
    if engine not in LORA_ENGINES:
        raise UsageError(f"--engine {engine} cannot serve LoRA adapters here (--lora, --max-loras)",
                         hint="use --engine hf or --engine vllm, or serve a merged model (`rlctl merge`)")
    slots = check_slots(len(specs), max_loras)
    if engine == "vllm":
        if max_rank is not None and max_rank not in VLLM_RANKS:
            raise UsageError(f"--max-lora-rank {max_rank} is not a rank vLLM takes "
                             f"({', '.join(map(str, VLLM_RANKS))})")
        from rlctl.workers.compute.lora import meta_model

        adapters = check_adapters(specs, meta_model(str(base_folder)), base_name, max_rank)
        max_rank = vllm_rank([a.rank for a in adapters], max_rank)
    return {"adapters": specs, "slots": slots, "max_rank": max_rank}


def vllm_lora_args(plan: dict) -> list[str]:
    """vLLM's server flags for `plan` (its --lora-modules NAME=DIR form)."""
    argv = ["--enable-lora", "--max-loras", str(plan["slots"]), "--max-cpu-loras", str(plan["slots"]),
            "--max-lora-rank", str(plan["max_rank"])]
    if plan["adapters"]:
        argv += ["--lora-modules", *(f"{name}={folder}" for name, folder in plan["adapters"])]
    return argv


def parse_lora_args(values: list[str], base_name: str) -> list[tuple[str, Path]]:
    """`--lora NAME=DIR` values (vLLM's --lora-modules form) -> [(name, folder)]; UsageError on a bad one."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise UsageError(f"--lora {value!r} is not NAME=DIR", hint="e.g. --lora sql=adapters/sql")
        if name in out or name == base_name:
            what = "the base model's name" if name == base_name else "given twice"
            raise UsageError(f"--lora name {name!r} is {what}", hint="give every adapter its own name")
        out[name] = Path(folder)
    return list(out.items())


def check_slots(count: int, max_loras: int | None) -> int:
    """The number of adapter slots: --max-loras, else room for the --lora adapters and a few more."""
    slots = max_loras if max_loras is not None else max(DEFAULT_SLOTS, count)
    if count > slots:
        raise UsageError(f"{count} --lora adapters but --max-loras {slots}",
                         hint=f"raise --max-loras to at least {count}, or serve fewer adapters")
    return slots


def check_adapters(specs: list[tuple[str, Path]], base, base_name: str, max_rank: int | None,
                   dtype=None) -> list[LoraAdapter]:
    """Read every adapter and check it fits `base` (a torch model, or its meta-device twin) within
    `max_rank`; the first problem is a DataError (exit 3)."""
    adapters = []
    for name, folder in specs:
        if not folder.is_dir():
            raise DataError(f"adapter {name!r}: {folder} is not a folder", hint="pass a PEFT adapter folder")
        adapter = read_adapter(name, folder, dtype)
        check_fits(adapter, base, base_name)
        if max_rank is not None and adapter.rank > max_rank:
            raise DataError(f"adapter {name!r} has rank {adapter.rank}, above --max-lora-rank {max_rank}",
                            hint=f"pass --max-lora-rank {adapter.rank} or more")
        adapters.append(adapter)
    return adapters


class ServedAdapters:
    """name -> (slot, folder) over one LoraSlots on the served model."""

    def __init__(self, model, base_name: str, *, slots: int, max_rank: int):
        from rlctl.models.lora_slots import LoraSlots

        self.model, self.base_name, self.max_rank = model, base_name, max_rank
        self.lora = LoraSlots(model, slots=slots, max_rank=max_rank)
        self._slots: dict[str, tuple[int, Path, int]] = {}   # name -> (slot, folder, created)

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def slot_of(self, name: str) -> int | None:
        held = self._slots.get(name)
        return held[0] if held else None

    def cards(self) -> list[dict]:
        """GET /v1/models entries of the adapters, as vLLM writes them (root: the folder, parent: the base)."""
        return [{"id": name, "object": "model", "created": created, "owned_by": "rlctl", "root": str(folder),
                 "parent": self.base_name} for name, (_, folder, created) in self._slots.items()]

    def read(self, name: str, folder: str | Path) -> LoraAdapter:
        """Read and check an adapter (on the caller's thread: file I/O stays off the scheduler)."""
        first = next(self.model.parameters())
        return check_adapters([(name, Path(folder))], self.model, self.base_name, self.max_rank, first.dtype)[0]

    def add(self, adapter: LoraAdapter, busy: set[int], replace: bool = False) -> int:
        """Put `adapter` in a free slot (or its own, with replace); `busy`: slots queued or running rows hold."""
        held = self._slots.get(adapter.name)
        if held and not replace:
            raise APIError(400, f"The lora adapter '{adapter.name}' has already been loaded. If you want to "
                                "load the adapter in place, set 'load_inplace' to True.")
        taken = {slot for slot, _, _ in self._slots.values()} | busy
        if held and held[0] not in busy:
            slot = held[0]
        else:
            free = [s for s in range(1, self.lora.slots + 1) if s not in taken]
            if not free:
                raise APIError(400, f"all {self.lora.slots} adapter slots are in use ({', '.join(self._slots)}); "
                                    "unload one with POST /v1/unload_lora_adapter, or restart with a larger "
                                    "--max-loras", code="no_free_adapter_slot")
            slot = free[0]
        self.lora.put(slot, adapter.weights)
        self._slots[adapter.name] = (slot, adapter.path, int(time.time()))
        return slot

    def remove(self, name: str) -> None:
        if name not in self._slots:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", code="adapter_not_found")
        del self._slots[name]
