"""The MoE load-balancing (auxiliary) loss in the actor's update, as transformers defines it.

transformers' MoE causal LMs (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, ...) return, when called with
output_router_logits=True, `aux_loss = load_balancing_loss_func(router_logits, E, k, attention_mask)`:
Switch Transformer's E * sum_e f_e * P_e over every layer's router, f_e the share of top-k
assignments that go to expert e and P_e its mean router probability, over the tokens the mask keeps;
their own training loss adds `router_aux_loss_coef * aux_loss`. The update adds the same term,
computed by the model itself over the tokens its forward runs (prompt and response, never padding:
rlctl.workers.compute.logprob's layouts drop it), so it is the same at any actor.expert_parallel_size (the
router is dense; only the experts are split).

Each micro-batch's term is weighted by its share of the mini-batch's response tokens, as the
token-mean policy loss is (times dp_size: FSDP averages gradients over the ranks), so the summed
term is the token-weighted mean of the micro-batches' aux losses, times the coefficient.
"""

from __future__ import annotations

import torch

from rlctl.errors import ConfigError
from rlctl.workers.parallel.expert_parallel import experts_per_layer

KEY = "actor.moe_aux_loss_coef"
METRIC = "moe_aux_loss"   # logged as actor/moe_aux_loss


def configured_coef(model_config, setting: float) -> float:
    """The coefficient for a transformers config: 0 for a dense model; `setting` when >= 0; else
    (-1) the config's router_aux_loss_coef (transformers' default for the family)."""
    if model_config is None or experts_per_layer(model_config) == 0:
        return 0.0
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return float(setting) if setting >= 0 else float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0)


def sp_refusal(coef: float, sp_size: int) -> str:
    """Why the term cannot run with sequence parallelism ("" when it can)."""
    if coef > 0 and sp_size > 1:
        return (f"the MoE load-balancing loss ({KEY} = {coef}) is not supported with sequence parallelism yet: "
                f"each rank would see a slice of the routed tokens; set {KEY} = 0, or "
                "actor.ulysses_sequence_parallel_size = 1")
    return ""


def resolve_coef(model: torch.nn.Module, setting: float, sp_size: int = 1) -> float:
    """The coefficient the update uses (configured_coef of the model's config); a non-zero one with
    sequence parallelism is refused."""
    coef = configured_coef(getattr(model, "config", None), setting)
    if why := sp_refusal(coef, sp_size):
        raise ConfigError(why)
    return coef


def add_aux_loss(loss: torch.Tensor, metrics: dict, out: dict, response_mask: torch.Tensor, norm,
                 coef: float) -> torch.Tensor:
    """loss + coef x aux x (this micro-batch's share of the mini-batch's response tokens x dp_size);
    metrics[METRIC] gets aux x that share (summed over micro-batches and ranks / W: the weighted
    mean). coef = 0 returns `loss` itself, untouched."""
    if coef == 0:
        return loss
    aux = out.get(METRIC)
    if aux is None:
        raise ConfigError(f"{KEY} = {coef} but the model returned no router aux loss (output_router_logits)",
                          hint=f"set {KEY} = 0 for this model")
    share = float((response_mask != 0).sum()) / norm.tokens * norm.dp_size
    metrics[METRIC] = float(aux.detach()) * share
    return loss + coef * share * aux.to(loss.dtype)
