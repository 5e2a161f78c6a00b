"""What a converted verl launch means beyond key-by-key renames: verl's batch arithmetic, the rollout
engines rlctl runs differently, and on-policy distillation. Called by rlctl.config.from_verl.convert
after the rules; each adjustment is noted in the output file's header with why.

Batch arithmetic. verl normalises the actor's mini-batch per data-parallel rank:
    per_rank = ppo_mini_batch_size * rollout.n // (world_size // ulysses_sp)        (floored)
and refuses a launch where that is 0 or not a multiple of ppo_micro_batch_size_per_gpu (without
use_dynamic_bsz). rlctl counts the mini-batch in whole prompts that split evenly over its workers,
so where verl's floor is not exact the converter picks the whole-prompt mini-batch nearest verl's
effective one (per_rank * dp sequences), and a micro-batch that divides each worker's share.
"""

from __future__ import annotations

import math

from rlctl.errors import UsageError

_A = "actor_rollout_ref"


def adjust(out: dict, sources: dict, values: dict, notes: list, megatron: bool, grouped: frozenset) -> None:
    """Apply verl's meaning to the mapped values in place; `notes` gets (verl key, value, why).
    `megatron`: the launch trains with verl's Megatron engine (its data-parallel size is the GPUs
    over tensor x pipeline x context parallel). `grouped`: rlctl's estimators that need rollout.n >= 2."""
    _engine(out, sources, notes)
    _distill(out, sources, notes, grouped)
    for role in ("actor", "critic"):
        _batches(out, sources, values, notes, role, _model_parallel(values, role) if megatron else 1)


def _model_parallel(values: dict, role: str) -> int:
    prefix = f"{_A}.actor.megatron" if role == "actor" else "critic.megatron"
    sizes = [values.get(f"{prefix}.{k}_parallel_size", 1) for k in ("tensor_model", "pipeline_model", "context")]
    return math.prod(v for v in sizes if isinstance(v, int) and v > 0)


def _engine(out: dict, sources: dict, notes: list) -> None:
    """rlctl's sglang rollout runs one engine per rank (tensor-parallel 1): a verl launch with a
    larger tensor_model_parallel_size keeps it on vLLM, which rlctl runs tensor-parallel. verl's
    TensorRT-LLM rollout is not in rlctl: vLLM takes its place."""
    tp = out.get("rollout.tensor_parallel_size", 1)
    if out.get("rollout.engine") == "trtllm":
        out["rollout.engine"] = "vllm"
        notes.append((f"{_A}.rollout.name", "trtllm", "rlctl has no TensorRT-LLM rollout; vllm (same sampling "
                                                      "settings) takes its place"))
    if out.get("rollout.engine") == "sglang" and isinstance(tp, int) and tp > 1:
        out["rollout.engine"], sources["rollout.engine"] = "vllm", f"{_A}.rollout.name"
        notes.append((f"{_A}.rollout.name", "sglang", f"rlctl's sglang rollout is tensor-parallel 1; vllm keeps "
                                                      f"verl's tensor_model_parallel_size={tp}"))


def _distill(out: dict, sources: dict, notes: list, grouped: frozenset) -> None:
    """verl's OPD runs GRPO with rollout.n = 1 (a group of one: zero task advantage) beside the
    teacher. rlctl's grpo refuses groups of one; with distill.use_task_reward = false the
    estimator's advantages are not trained on, so a group-free estimator stands in."""
    name, n = out.get("algorithm.name", "gae"), out.get("rollout.n", 1)
    if out.get("distill.teacher") and n < 2 and name in grouped:
        out["algorithm.name"], sources["algorithm.name"] = "reinforce_plus_plus", "algorithm.adv_estimator"
        notes.append(("algorithm.adv_estimator", name, f"{name} over groups of rollout.n={n} gives no task advantage "
                      "in verl's OPD and rlctl's needs n >= 2; the teacher trains the student "
                      "(distill.use_task_reward = false), so reinforce_plus_plus (no groups) stands in"))


def _world(out: dict) -> int | None:
    gpus, nodes = out.get("resources.gpus_per_node", 8), out.get("resources.nodes", 1)
    return gpus * nodes if isinstance(gpus, int) and isinstance(nodes, int) and gpus > 0 and nodes > 0 else None


def _batches(out: dict, sources: dict, values: dict, notes: list, role: str, model_parallel: int) -> None:
    """verl's floor per data-parallel rank, or its refusal; else rlctl sizes nearest to verl's."""
    world, mini_key = _world(out), f"{role}.mini_batch_size"
    batch, mini, n = out.get("data.batch_size"), out.get(mini_key), out.get("rollout.n", 1)
    if role == "critic" and out.get("algorithm.name") not in ("gae", "vapo"):
        return
    if not world or not all(isinstance(v, int) and v > 0 for v in (batch, mini, n)):
        return
    sp = out.get(f"{role}.ulysses_sequence_parallel_size", 1)
    dp = max(world // (sp if isinstance(sp, int) and sp > 0 else 1) // model_parallel, 1)
    per_rank = mini * n // dp
    verl_key = f"{_A}.actor.ppo_mini_batch_size" if role == "actor" else "critic.ppo_mini_batch_size"
    if per_rank == 0:
        raise UsageError(f"{verl_key}={mini} x rollout.n={n} // {dp} data-parallel ranks = 0: verl refuses this "
                         "launch too (\"ppo_mini_batch_size should be larger than 0 after normalization\")",
                         hint=f"raise {verl_key} to at least {math.ceil(dp / n)}, or use fewer GPUs.")
    micro, budget = out.get(f"{role}.micro_batch_size"), out.get(f"{role}.micro_batch_max_tokens")
    if isinstance(micro, int) and micro > 0 and not budget and per_rank % micro:
        micro_key = f"{_A}.actor.ppo_micro_batch_size_per_gpu" if role == "actor" else "critic.ppo_micro_batch_size_per_gpu"
        raise UsageError(f"{verl_key}={mini} x rollout.n={n} // {dp} ranks = {per_rank} per rank, not a multiple of "
                         f"{micro_key}={micro}: verl refuses this launch too (\"normalized ppo_mini_batch_size "
                         f"{per_rank} should be divisible by ppo_micro_batch_size_per_gpu {micro}\")",
                         hint=f"set {micro_key} to a divisor of {per_rank}.")
    if batch * n % world:
        return   # verl's update refuses an uneven split too (DataProto.chunk): validate says so
    if (mini * n) % world or batch % mini:
        chosen = _nearest_mini(batch, n, world, per_rank * dp)
        out[mini_key], sources[mini_key] = chosen, verl_key
        how = "floors" if mini * n % dp else "splits"
        notes.append((verl_key, str(mini), f"verl {how} {mini} x n {n} over {dp} data-parallel ranks to {per_rank} "
                      f"sequences per rank ({per_rank * dp} an update); rlctl's mini-batch is whole prompts split "
                      f"evenly over {world} workers: {chosen} prompts ({chosen * n} sequences)"))
        mini = chosen
    per_worker = mini * n // world
    if micro is None:   # verl's launch left it to the token budget or its default: rlctl's default must still fit
        from rlctl.config.loader import LEAF_KEYS

        micro = LEAF_KEYS[f"{role}.micro_batch_size"].default
    if isinstance(micro, int) and micro > 0 and not budget and per_worker % micro:
        fitted = math.gcd(micro, per_worker)
        out[f"{role}.micro_batch_size"] = fitted
        sources[f"{role}.micro_batch_size"] = f"{role} micro-batch, fitted"
        notes.append((f"{role} micro-batch", str(micro), f"each of rlctl's {world} workers gets {per_worker} sequences "
                      f"an update (verl's ranks {per_rank} over {dp} data-parallel groups): micro-batches of {fitted}"))


def _nearest_mini(batch: int, n: int, world: int, target: int) -> int:
    """The whole-prompt mini-batch (a divisor of batch, its sequences split over world) nearest target sequences."""
    fits = [d for d in range(1, batch + 1) if batch % d == 0 and (d * n) % world == 0]
    return min(fits, key=lambda d: (abs(d * n - target), d))
