"""Expert parallelism: every MoE layer's experts split over the ranks of an expert group.

With W training ranks and ep = actor.expert_parallel_size, rank r belongs to the expert group of
ranks [r - r % ep, ...) and keeps experts [e0, e0 + E/ep) of each layer, e0 = (r % ep) * E/ep.
The router, attention and everything dense stay FSDP2-sharded over all W ranks as before; the
expert banks (transformers 5 fuses them into 3-D `gate_up_proj` [E, 2I, H] / `down_proj`
[E, H, I]) are left out of FSDP and held whole-but-local.

One MoE layer's forward on a rank with n tokens routed top-k:
    sort the n*k (token, expert) pairs by expert -> they are grouped by owner rank
    all-to-all #1: each pair's hidden state [H] to its expert's rank (split sizes exchanged first)
    the module's own transformers forward on the received rows (local ids, weight 1, top-1)
    all-to-all #2: the outputs back; unsort, weight by the router's top-k weights, sum over k
Both all-to-alls are autograd functions, so backward sends the gradients the same way back.

Gradients: FSDP *averages* the dense gradients over W ranks while an expert's gradient on its
owner is the *sum* of every rank's tokens' contributions (all-to-all #2's backward brings them),
so `reduce_expert_grads` sums it over the W/ep copies of that expert and divides by W: the same
gradient the expert gets with ep = 1.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from rlctl.errors import ConfigError

# torch 2.13 marks the differentiable all-to-all deprecated in favour of a private module
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_to_all_single is deprecated")
_MARK = "_rlctl_expert_slice"   # (first expert, experts in the whole bank) on a split experts module
BANKS = ("gate_up_proj", "down_proj")
# The families whose expert banks are exactly BANKS with transformers' (hidden, top_k_index,
# top_k_weights) forward, tested at ep = 2 against ep = 1 (tests/workers/test_expert_parallel.py).
# Others are refused: gpt-oss's banks carry per-expert biases [E, ...] this split would leave whole.
TESTED_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def family_problem(model_type: str) -> str | None:
    """Why expert parallelism does not run `model_type`'s experts, or None for a tested family."""
    if model_type in TESTED_FAMILIES:
        return None
    return (f"expert parallelism is tested on {', '.join(TESTED_FAMILIES)}, not {model_type}, whose experts "
            "it may not split whole; set actor.expert_parallel_size = 1")


def expert_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The fused expert banks of an MoE model (transformers 5: `num_experts`, 3-D `gate_up_proj`
    and `down_proj`); [] for a dense model."""
    found = []
    for name, module in model.named_modules():
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if (isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)
                and gate_up.dim() == 3 and hasattr(module, "num_experts")):
            found.append((name, module))
    return found


def experts_per_layer(model_config) -> int:
    """Routed experts per MoE layer from a transformers config (num_experts / n_routed_experts /
    num_local_experts, whichever the family uses); 0 for a dense model."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


@dataclass(frozen=True)
class ExpertGroups:
    """This rank's place: its expert group (the ranks that split one set of experts) and its
    replica group (the W/ep ranks that hold the same experts)."""

    ep_size: int
    ep_rank: int
    world: int
    ep_group: object
    replica_group: object


def new_groups(ep_size: int) -> ExpertGroups:
    """Create the process groups (every rank must call this, in the same order)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if ep_size < 1 or world % ep_size:
        raise ConfigError(f"actor.expert_parallel_size = {ep_size} does not divide the {world} training ranks",
                          hint="set it to a divisor of the training ranks (1 = off)")
    ep_group = replica_group = None
    for start in range(0, world, ep_size):
        group = dist.new_group(list(range(start, start + ep_size)))
        if start <= rank < start + ep_size:
            ep_group = group
    for offset in range(ep_size):
        group = dist.new_group(list(range(offset, world, ep_size)))
        if rank % ep_size == offset:
            replica_group = group
    return ExpertGroups(ep_size, rank % ep_size, world, ep_group, replica_group)


def split_experts(model: torch.nn.Module, groups: ExpertGroups) -> list[torch.nn.Parameter]:
    """Keep this rank's slice of every expert bank and route the bank's forward through the
    all-to-all dispatch; returns the local expert parameters (to leave out of FSDP)."""
    modules = expert_modules(model)
    if not modules:
        raise ConfigError(f"actor.expert_parallel_size = {groups.ep_size} but {type(model).__name__} has no experts",
                          hint="expert parallelism is for mixture-of-experts models; set it to 1")
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    if why := family_problem(model_type):
        raise ConfigError(why)
    local: list[torch.nn.Parameter] = []
    for name, module in modules:
        if other := [n for n, _ in module.named_parameters() if n not in BANKS]:
            raise ConfigError(f"{name} has per-expert parameters expert parallelism does not split "
                              f"({', '.join(other)})", hint="set actor.expert_parallel_size = 1")
        total = int(module.num_experts)
        if total % groups.ep_size:
            raise ConfigError(f"{name} has {total} experts, not divisible by actor.expert_parallel_size = "
                              f"{groups.ep_size}", hint="choose an expert_parallel_size that divides the expert count")
        count = total // groups.ep_size
        first = groups.ep_rank * count
        for pname in ("gate_up_proj", "down_proj"):
            whole = getattr(module, pname)
            part = torch.nn.Parameter(whole.detach()[first:first + count].clone(), requires_grad=whole.requires_grad)
            setattr(module, pname, part)
            local.append(part)
        module.num_experts = count
        setattr(module, _MARK, (first, total))
        module._rlctl_expert_groups = groups
        module.forward = _dispatching_forward(module, module.forward, groups)
    return local


def is_split(module: torch.nn.Module) -> bool:
    return hasattr(module, _MARK)


def _dispatching_forward(module: torch.nn.Module, local_forward, groups: ExpertGroups):
    def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if getattr(module, "_rlctl_whole", False):   # inside whole_experts: every expert is here
            dtype = module.gate_up_proj.dtype             # the banks stay float32 masters (FSDP casts the rest)
            out = local_forward(hidden_states.to(dtype), top_k_index, top_k_weights.to(dtype))
            return out.to(hidden_states.dtype)
        return dispatch(hidden_states, top_k_index, top_k_weights, local_forward=local_forward,
                        local_experts=int(module.num_experts), groups=groups,
                        param_dtype=module.gate_up_proj.dtype)
    return forward


def dispatch(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *,
             local_forward, local_experts: int, groups: ExpertGroups, param_dtype: torch.dtype) -> torch.Tensor:
    """hidden_states [n, H], top_k_index / top_k_weights [n, k] (global expert ids) -> [n, H]:
    sum_k weight_k * expert_{index_k}(token), each expert run on the rank that holds it."""
    from torch.distributed.nn.functional import all_to_all_single   # differentiable (gloo and NCCL)

    n, k = top_k_index.shape
    ep, group = groups.ep_size, groups.ep_group
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)             # pairs grouped by expert, so by owner rank
    send_counts = torch.bincount(flat, minlength=local_experts * ep).view(ep, local_experts)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_sizes, recv_sizes = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    send = hidden_states[order // k].to(param_dtype)
    recv = all_to_all_single(send.new_empty((sum(recv_sizes), send.shape[1])), send,
                             output_split_sizes=recv_sizes, input_split_sizes=send_sizes, group=group)
    # rows arrive by source rank, each source's rows sorted by (local) expert
    local_ids = torch.arange(local_experts, device=flat.device).repeat(ep).repeat_interleave(recv_counts.reshape(-1))
    out = local_forward(recv, local_ids.unsqueeze(-1), torch.ones((len(recv), 1), dtype=recv.dtype, device=recv.device))
    if out.shape[0] == 0:
        out = out + recv.sum() * 0   # keep the empty rows in the graph: every rank's backward must run #2
    back = all_to_all_single(out.new_empty((n * k, out.shape[1])), out.contiguous(),
                             output_split_sizes=send_sizes, input_split_sizes=recv_sizes, group=group)
    per_pair = back[torch.argsort(order)].view(n, k, -1).to(hidden_states.dtype)
    return (per_pair * top_k_weights.unsqueeze(-1).to(hidden_states.dtype)).sum(1)


def reduce_expert_grads(params: list[torch.nn.Parameter], groups: ExpertGroups) -> None:
    """Expert gradients to the scale of FSDP's averaged dense ones: sum over the replicas of the
    same experts, / W (module docstring). A bank no token reached gets a zero gradient."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if groups.world > groups.ep_size:
            dist.all_reduce(p.grad, group=groups.replica_group)
        p.grad.div_(groups.world)


def expert_grad_sq(params: list[torch.nn.Parameter], groups: ExpertGroups) -> float:
    """Sum of squared expert gradients over the whole model (each expert counted once)."""
    local = sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None)
    total = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(total, group=groups.ep_group)
    return float(total.item())


def split_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in expert_modules(model) if is_split(m)]


def _gather_bank(module: torch.nn.Module, pname: str) -> torch.Tensor:
    groups: ExpertGroups = module._rlctl_expert_groups
    part = getattr(module, pname).detach().contiguous()
    pieces = [torch.empty_like(part) for _ in range(groups.ep_size)]
    dist.all_gather(pieces, part, group=groups.ep_group)
    return torch.cat(pieces)


@contextlib.contextmanager
def whole_experts(model: torch.nn.Module) -> Iterator[None]:
    """Inference with every expert on every rank (every rank calls, same order): the banks are
    all-gathered once and each layer runs its own transformers forward, no all-to-all. Generation
    and the log-prob pass run different numbers of forwards per rank, which a per-layer exchange
    cannot; the cost is one full copy of the experts per rank, as FSDP's whole_weights. The
    trained (local) parameters are put back afterwards, untouched."""
    saved = []
    try:
        for name, module in split_modules(model):
            _, total = getattr(module, _MARK)
            banks = {p: _gather_bank(module, p) for p in ("gate_up_proj", "down_proj")}
            for pname, bank in banks.items():
                check_whole_bank(f"{name}.{pname}", bank, total)
            saved.append((module, {p: module._parameters[p] for p in banks}, module.num_experts))
            for pname, bank in banks.items():
                module._parameters[pname] = torch.nn.Parameter(bank, requires_grad=False)
            module.num_experts, module._rlctl_whole = total, True
        yield
    finally:
        for module, params, count in saved:
            module._parameters.update(params)
            module.num_experts, module._rlctl_whole = count, False


def whole_parameter(modules: dict[str, torch.nn.Module], name: str, param: torch.Tensor) -> torch.Tensor:
    """The parameter `name` (of the model whose named_modules() are `modules`) with every expert: a
    split bank is all-gathered over its expert group (each rank of the group calls, in the same
    order); any other parameter is returned as it is, detached. A weight push or export calls it per
    tensor, so it never holds every expert at once; a bank that comes out short raises rather than
    be sent (an engine would load a partial bank as its first experts)."""
    owner, _, pname = name.rpartition(".")
    module = modules.get(owner)
    if module is None or pname not in ("gate_up_proj", "down_proj") or not is_split(module) \
            or getattr(module, "_rlctl_whole", False):
        return param.detach()
    bank = _gather_bank(module, pname)
    check_whole_bank(name, bank, getattr(module, _MARK)[1])
    return bank


def check_whole_bank(name: str, bank: torch.Tensor, total: int) -> None:
    """A weight push or export must carry every expert: a partial bank is a bug, never a model."""
    if bank.shape[0] != total:
        raise RuntimeError(f"{name} holds {bank.shape[0]} of {total} experts: refusing to send a partial expert set")


# --- checkpoints -------------------------------------------------------------------------------
# DCP would take the local banks (same names, different experts on each rank) for replicas and
# keep one rank's. Wrapped as DTensors sharded on dim 0 over the expert group, each rank writes its
# experts at their offsets in the whole [E, ...] bank, so a checkpoint loads at any ep (and in one
# process, for rlctl merge) as FSDP's shards do.
def sharded_state(model: torch.nn.Module, model_sd: dict, optim_sd: dict) -> None:
    """Wrap, in place, the split banks' entries (and their AdamW moments) of the state dicts."""
    for name, module in split_modules(model):
        groups: ExpertGroups = module._rlctl_expert_groups
        for pname in ("gate_up_proj", "down_proj"):
            fqn = f"{name}.{pname}"
            for sd, keys in ((model_sd, [fqn]), (optim_sd, [k for k in optim_sd if k.startswith(f"state.{fqn}.")])):
                for key in keys:
                    value = sd.get(key)
                    if torch.is_tensor(value) and value.dim() == 3 and not hasattr(value, "to_local"):
                        sd[key] = _as_shard(value, groups)


def local_state(*state_dicts: dict) -> None:
    """Undo sharded_state after a load: the local tensors (DCP loaded into their storage)."""
    for sd in state_dicts:
        for key, value in list(sd.items()):
            if getattr(value, "_rlctl_expert_shard", False):
                sd[key] = value.to_local()


def _as_shard(local: torch.Tensor, groups: ExpertGroups):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = DeviceMesh.from_group(groups.ep_group, "cuda" if torch.cuda.is_available() else "cpu")
    shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)   # even split: shape [E, ...]
    shard._rlctl_expert_shard = True
    return shard
