"""Router replay (actor.router_replay): the update sends each response token through the experts
the log-prob pass chose for it, in every MoE layer.

The log-prob pass (compute_log_prob, the old policy's forward) records, per response token j and
MoE layer l, the top-k expert ids its router picked at the position that predicts token j (the
output whose logits give log pi(token j)): the batch column `routed_experts` [B, T, L, k], in the
router's own order (descending probability), 0 on padding; uint8 up to 256 experts a layer, else
int16 (B x T x L x k ids: the largest column the batch carries). The update's forward then
replaces, at those positions, the ids its router would pick by the recorded ones, and weights them
with the *current* router's probabilities at those ids (renormalised over the k when the model's
norm_topk_prob is set, as its router does), so the router keeps its gradient:
    p = softmax(router_logits)  [n, E]     w_i = p[ids_i] / sum_i p[ids_i]   (norm_topk_prob)
Other positions (the prompt's) route as the model does. Routes equal to the model's own give the
same ids, the same weights, so bit for bit the same loss and gradients as replay off. Replacing the
ids before the experts run serves expert parallelism unchanged (its dispatch takes them as given).

actor/router_mismatch: the share of (response token, MoE layer) pairs (response_mask != 0) whose
top-k *set* the update's router computes differs from the replayed one. The load-balancing loss
reads the router's logits and takes its own top-k of them, so it still sees the routes the router
would choose: it balances the router, not the replayed assignments.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from rlctl.errors import ConfigError
from rlctl.workers.parallel.expert_parallel import expert_modules

KEY = "actor.router_replay"
COLUMN = "routed_experts"          # uint8 / int16 [B, T, L, k]
RECORD = "record"                  # response_log_probs(routes=RECORD): the pass records its routes
MISMATCH, PAIRS = "router_mismatch_pairs", "router_pairs"   # additive update metrics (rlctl.workers.compute.training)
# model type -> its router, whose forward is softmax -> top-k -> optional renormalisation (transformers 5)
REPLAYABLE = {"qwen3_moe": "Qwen3MoeTopKRouter", "qwen2_moe": "Qwen2MoeTopKRouter", "olmoe": "OlmoeTopKRouter"}
_PLAN = "_rlctl_route_plan"


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router (`gate` beside the experts) of each MoE layer, in layer order; [] for a dense model."""
    found = []
    for name, _ in expert_modules(model):
        parent = model.get_submodule(name.rpartition(".")[0])
        gate = getattr(parent, "gate", None)
        if gate is not None:
            found.append(gate)
    return found


def unsupported(model: torch.nn.Module) -> str:
    """Why router replay cannot serve this model ("" when it can)."""
    found = routers(model)
    if not found:
        return f"{type(model).__name__} has no mixture-of-experts layers: router replay is for MoE policies"
    odd = sorted({type(g).__name__ for g in found} - set(REPLAYABLE.values()))
    return f"its router {odd[0]} is not one router replay knows ({', '.join(REPLAYABLE.values())})" if odd else ""


def install(model: torch.nn.Module) -> bool:
    """Let every router of `model` record or replay routes (a plan set per forward; none = the
    model's own forward, untouched). Returns True; a model replay cannot serve is refused."""
    if why := unsupported(model):
        raise ConfigError(f"{KEY} = true but {why}", hint=f"set {KEY} = false")
    for layer, gate in enumerate(routers(model)):
        if not hasattr(gate, _PLAN):
            setattr(gate, _PLAN, None)
            gate.forward = _routing_forward(gate, gate.forward, layer)
    return True


@dataclass
class _Plan:
    """One forward's routes: positions [M] (flat index into the forward's tokens of each response
    token's predictor), replay [M, L, k] ids (None: record), counted [M] bool (response_mask != 0)."""

    positions: torch.Tensor
    replay: torch.Tensor | None = None
    counted: torch.Tensor | None = None
    recorded: dict = field(default_factory=dict)      # layer -> [M, k] ids the router chose
    mismatched: dict = field(default_factory=dict)    # layer -> mismatched pairs, 0-d (first call only)


def _routing_forward(gate: torch.nn.Module, own_forward, layer: int):
    def forward(hidden_states: torch.Tensor):
        logits, weights, ids = own_forward(hidden_states)
        plan: _Plan | None = getattr(gate, _PLAN)
        if plan is None:
            return logits, weights, ids
        fresh = ids[plan.positions]
        if plan.replay is None:
            plan.recorded.setdefault(layer, fresh.detach())
            return logits, weights, ids
        replayed = plan.replay[:, layer].to(ids.dtype)
        if layer not in plan.mismatched:   # a recompute (gradient checkpointing) counts nothing twice
            differs = (fresh.sort(-1).values != replayed.sort(-1).values).any(-1)
            plan.mismatched[layer] = (differs & plan.counted).sum()   # a tensor: no device sync per layer
        chosen = ids.clone()
        chosen[plan.positions] = replayed
        picked = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, chosen)   # [n, k]
        if gate.norm_topk_prob:
            picked = picked / picked.sum(dim=-1, keepdim=True)
        return logits, picked.to(logits.dtype), chosen
    return forward


@dataclass(frozen=True)
class Replay:
    """What the update replays for a micro-batch: ids [b, T, L, k] and response_mask [b, T]."""

    ids: torch.Tensor
    response_mask: torch.Tensor


def replay_of(micro: dict) -> Replay:
    if COLUMN not in micro:
        raise ConfigError(f"{KEY} = true but the batch holds no {COLUMN} (compute_log_prob records them)",
                          hint="run the log-prob pass before update_actor")
    return Replay(micro[COLUMN], micro["response_mask"])


def start(model: torch.nn.Module, layout, routes) -> _Plan:
    """Set the plan of the coming forward on `layout` (rlctl.workers.compute.logprob.Layout): routes = RECORD
    or a Replay. It stays set (a gradient-checkpointing recompute replays it) until `clear`."""
    width = layout.input_ids.shape[-1]
    positions = layout.pred_row * width + layout.pred_col                  # [M]
    valid = layout.response_valid
    plan = _Plan(positions) if routes == RECORD else \
        _Plan(positions, routes.ids[valid].long(), routes.response_mask[valid] != 0)
    for gate in routers(model):
        setattr(gate, _PLAN, plan)
    return plan


def outputs(model: torch.nn.Module, plan: _Plan, response_valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """The forward's route outputs: recorded ids as COLUMN [b, T, L, k] (record; the plan is
    cleared), or the mismatch counts (replay) as 0-d tensors."""
    found = routers(model)
    if plan.replay is not None:
        pairs = plan.counted.sum() * len(found)
        return {MISMATCH: sum(plan.mismatched.values(), torch.zeros(())).float(), PAIRS: pairs.float()}
    clear(model)
    ids = torch.stack([plan.recorded[layer] for layer in sorted(plan.recorded)], dim=1)   # [M, L, k]
    dtype = torch.uint8 if max(int(g.num_experts) for g in found) <= 256 else torch.int16
    out = torch.zeros((*response_valid.shape, *ids.shape[1:]), dtype=dtype, device=ids.device)
    out[response_valid] = ids.to(dtype)
    return {COLUMN: out}


def counts(out: dict) -> dict[str, float]:
    """The replay forward's mismatch counts as update metrics (summed over micro-batches and ranks)."""
    return {key: float(out[key]) for key in (MISMATCH, PAIRS) if key in out}


@contextlib.contextmanager
def cleared_after(model: torch.nn.Module) -> Iterator[None]:
    """No plan outlives the update (generation and the next log-prob pass route as the model does)."""
    try:
        yield
    finally:
        clear(model)


def clear(model: torch.nn.Module) -> None:
    for gate in routers(model):
        if hasattr(gate, _PLAN):
            setattr(gate, _PLAN, None)


def mismatch_share(metrics: dict[str, float]) -> dict[str, float]:
    """The update's metrics with the additive pair counts turned into router_mismatch (a share)."""
    if PAIRS not in metrics:
        return metrics
    out = dict(metrics)
    mismatched, pairs = out.pop(MISMATCH, 0.0), out.pop(PAIRS)
    out["router_mismatch"] = mismatched / pairs if pairs else 0.0
    return out
