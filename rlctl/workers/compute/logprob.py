"""Per-token outputs for the response part of [prompt ++ response] rows, without padding compute.

Rows arrive as input_ids/attention_mask [b, P+T] (left-padded prompt, right-padded response).
The token at column P+j is predicted by the model output at the previous real token, so for
each real response token we gather the output of its predecessor. Three ways to drop padding:

  shared (Llama-style models, the default there): one row [1, N] holding each distinct prompt
      once, followed by the responses that continue it (rlctl.workers.compute.shared_prompt): the n
      samples of a prompt pay for its tokens once, and nothing is padding.
  pack (other flash-attention models): all real tokens of the micro-batch in one row [1, N]
      with position_ids restarting at 0 per sequence; transformers then runs varlen attention.
  trim (other sdpa/eager models): each row's real tokens moved to the left, the micro-batch cut
      to its longest real length [b, L_max] (right padding, so no query row is fully masked).

Only the positions that predict response tokens go through the LM head (`logits_to_keep`), so
prompt logits are never materialised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlctl.errors import ConfigError, DataError
from rlctl.workers.compute import shared_prompt
from rlctl.workers.compute.micro_batches import plan_micro_batches
from rlctl.workers.compute.vision import POSITION_IDS, ban_placeholders, model_inputs, placeholder_ids
from rlctl.workers.compute.vocab_logprob import token_log_probs
from rlctl.workers.parallel import router_replay, ulysses


@dataclass
class Layout:
    """Model inputs without padding and where each response token's predictor sits in the output."""

    input_ids: torch.Tensor        # [1, N] (shared, pack) or [b, L_max] (trim)
    position_ids: torch.Tensor     # same shape as input_ids
    attention_mask: torch.Tensor | None  # None when packed (position_ids mark the boundaries)
    pred_row: torch.Tensor         # [M] output row of the predictor of each real response token
    pred_col: torch.Tensor         # [M] output column of that predictor
    targets: torch.Tensor          # [M] the response tokens themselves
    response_valid: torch.Tensor   # [b, T] bool, where the M values go back
    shared: shared_prompt.SharedPrompt | None = None  # the attention plan of the shared layout
    images: dict | None = None     # vision models: pixel_values and image_grid_thw of the rows' images
    aux_loss: torch.Tensor | None = None  # MoE: the forward's router load-balancing loss (rlctl.workers.parallel.moe_aux)
    routes: dict | None = None     # router replay's outputs of the forward (rlctl.workers.parallel.router_replay)

    def forward(self, model: torch.nn.Module, **kwargs):
        """model(...) on this layout; the shared layout routes attention through its plan."""
        if self.shared is None:
            return model(input_ids=self.input_ids, attention_mask=self.attention_mask,
                         position_ids=self.position_ids, use_cache=False, **(self.images or {}), **kwargs)
        with shared_prompt.attention(model):
            return model(input_ids=self.input_ids, position_ids=self.position_ids, use_cache=False,
                         **{shared_prompt.KWARG: self.shared}, **kwargs)


def choose_layout(model: torch.nn.Module, width: int, pack: bool | None = None,
                  sp: ulysses.SPGroup | None = None) -> str:
    """"shared" where the model supports it, else "pack" under flash attention, else "trim";
    `pack` (tests, tools) forces pack (True) or trim (False). Sequence parallelism (`sp`, the
    engine's group) always packs (rlctl.workers.parallel.ulysses slices the packed row)."""
    if sp is not None:
        return "pack"
    if pack is not None:
        return "pack" if pack else "trim"
    if shared_prompt.supported(model, width):
        return "shared"
    return "pack" if use_packing(model) else "trim"


def pads_rows(model: torch.nn.Module, width: int, sp: ulysses.SPGroup | None = None) -> bool:
    """Whether a micro-batch's forward runs on rows x longest row (the trim layout), not on its real
    tokens alone (shared, pack): the cost rlctl.workers.compute.micro_batches budgets."""
    return choose_layout(model, width, sp=sp) == "trim"


def inference_order(model: torch.nn.Module, attention_mask: np.ndarray,
                    sp: ulysses.SPGroup | None = None) -> np.ndarray:
    """Row order for forward-only micro-batches of [B, P+T] rows: as given (prompt-major) under the
    shared layout, so a prompt's samples meet in one micro-batch; else by real length, so the rows
    of a micro-batch pad little."""
    if choose_layout(model, attention_mask.shape[1], sp=sp) == "shared":
        return np.arange(len(attention_mask))
    return np.argsort(attention_mask.sum(1), kind="stable")


def batched_response_outputs(model: torch.nn.Module, device: torch.device, batch, micro_batch_size: int, *,
                             forward=None, max_tokens: int = 0, sp: ulysses.SPGroup | None = None,
                             **kwargs) -> dict[str, np.ndarray]:
    """`forward` (default response_log_probs) over a Batch of [B, P+T] rows in micro-batches of
    `micro_batch_size`, in inference_order (max_tokens > 0: micro-batches of at most that many
    tokens, rlctl.workers.compute.micro_batches); its [b, T] outputs as numpy [B, T] in the batch's row
    order. `forward(model, input_ids, attention_mask, T, sp=sp, **kwargs)` returns a dict of tensors
    (`sp`: the engine's sequence-parallel group, or None); a vision batch's rows also pass
    vision=rlctl.workers.compute.vision.model_inputs(rows).
    The caller holds the contexts (no_grad, autocast, adapters). One loop for the actor, the
    critic and the one_step_off rollout rank, so equal weights give equal numbers."""
    forward = forward or response_log_probs
    width = batch["response_mask"].shape[1]
    if max_tokens:   # whole weights here: ranks may run different counts (no synced plan)
        groups = plan_micro_batches(batch["attention_mask"].sum(1), max_tokens=max_tokens, max_rows=micro_batch_size,
                                    padded=pads_rows(model, batch["attention_mask"].shape[1], sp))
        order, micros = np.concatenate(groups), [batch.select(g) for g in groups]
    else:
        order = inference_order(model, batch["attention_mask"], sp)
        micros = batch.select(order).split(micro_batch_size)
    parts: dict[str, list] = {}
    for micro in micros:
        t = micro.to_torch(device, keys=["input_ids", "attention_mask"])
        vision = model_inputs(micro, device)
        more = {"vision": vision} if vision else {}
        for key, value in forward(model, t["input_ids"], t["attention_mask"], width, sp=sp, **more, **kwargs).items():
            parts.setdefault(key, []).append(value.cpu().numpy())
    inverse = np.argsort(order)
    return {key: np.concatenate(values)[inverse] for key, values in parts.items()}


def make_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, *,
                pack: bool = False, layout: str | None = None, vision: dict | None = None) -> Layout:
    """The unpadded model input of a micro-batch; layout "shared" | "pack" | "trim" (else from `pack`).
    vision (rlctl.workers.compute.vision.model_inputs): the rows' M-RoPE positions [3, b, P+T] move with
    their tokens (trim: [3, b, L_max]; pack: [4, 1, N], row 0 the per-sequence text positions that
    mark the boundaries, as transformers' Qwen2.5-VL reads a packed row) and the images ride along."""
    layout = layout or ("pack" if pack else "trim")
    if vision:
        text = make_layout(input_ids, attention_mask, response_width, layout="pack" if layout == "pack" else "trim")
        return _vision_layout(text, attention_mask, vision)
    b, width = input_ids.shape
    prompt_width = width - response_width
    valid = attention_mask.bool()
    pos = valid.long().cumsum(1) - 1                       # [b, P+T] index among the row's real tokens
    response_valid = valid[:, prompt_width:]               # [b, T]
    rows = torch.arange(b, device=input_ids.device)[:, None].expand(b, response_width)[response_valid]
    target_pos = pos[:, prompt_width:][response_valid]     # [M]
    if bool((target_pos < 1).any()):
        raise DataError("a response has no prompt token before it; every prompt needs at least one token")
    targets = input_ids[:, prompt_width:][response_valid]
    lengths = valid.sum(1)                                 # [b]
    if layout == "shared":
        ids, positions, plan, pred = shared_prompt.pack(input_ids, valid, response_width)
        return Layout(input_ids=ids, position_ids=positions, attention_mask=None, pred_row=torch.zeros_like(rows),
                      pred_col=pred, targets=targets, response_valid=response_valid, shared=plan)
    if layout == "pack":
        offsets = lengths.cumsum(0) - lengths              # [b] start of each row in the packed row
        return Layout(input_ids=input_ids[valid][None], position_ids=pos[valid][None], attention_mask=None,
                      pred_row=torch.zeros_like(rows), pred_col=offsets[rows] + target_pos - 1,
                      targets=targets, response_valid=response_valid)
    max_len = int(lengths.max())
    row_of = torch.arange(b, device=input_ids.device)[:, None].expand_as(valid)[valid]
    ids = torch.zeros((b, max_len), dtype=input_ids.dtype, device=input_ids.device)
    ids[row_of, pos[valid]] = input_ids[valid]
    cols = torch.arange(max_len, device=input_ids.device)[None, :]
    return Layout(input_ids=ids, position_ids=cols.expand(b, max_len).contiguous(),
                  attention_mask=(cols < lengths[:, None]).long(), pred_row=rows, pred_col=target_pos - 1,
                  targets=targets, response_valid=response_valid)


def _vision_layout(text: Layout, attention_mask: torch.Tensor, vision: dict) -> Layout:
    """A text layout (trim or pack) with the carried M-RoPE positions put where its tokens went."""
    valid = attention_mask.bool()
    carried = vision[POSITION_IDS]                           # [3, b, P+T]
    if text.attention_mask is None:                          # pack: [1, N] in row-major order of valid
        positions = torch.cat([text.position_ids, carried[:, valid]], dim=0)[:, None, :]
    else:                                                    # trim: each row's real tokens moved left
        b, width = text.input_ids.shape
        positions = carried.new_zeros(3, b, width)
        row_of = torch.arange(b, device=valid.device)[:, None].expand_as(valid)[valid]
        positions[:, row_of, valid.long().cumsum(1)[valid] - 1] = carried[:, valid]
    text.position_ids = positions
    text.images = {k: v for k, v in vision.items() if k != POSITION_IDS}
    return text


def use_packing(model: torch.nn.Module) -> bool:
    """Pack only where attention is varlen (flash); a packed row under sdpa costs O(N^2) memory."""
    config = getattr(model, "config", None)
    impl = str(getattr(config, "_attn_implementation", "") or "")
    return "flash" in impl


def response_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_width: int, *, pack: bool | None = None, vision: dict | None = None,
                    moe_aux: bool = False, routes=None) -> tuple[torch.Tensor, Layout]:
    """The logits [M, V] (in the model's output dtype) that predict each real response token, and the
    layout that says where each of the M rows goes back ([b, T], row-major over response_valid). moe_aux: the
    layout also carries the MoE model's aux_loss over the tokens the forward ran (no padding).
    routes (router replay): record the routers' choices, or replay given ones (layout.routes)."""
    layout = make_layout(input_ids, attention_mask, response_width,
                         layout=choose_layout(model, input_ids.shape[1], pack), vision=vision)
    more = {"output_router_logits": True} if moe_aux else {}
    plan = router_replay.start(model, layout, routes) if routes is not None else None
    if layout.shared is not None:   # the predictors' positions, in target order (prompts never reach the head)
        out = layout.forward(model, logits_to_keep=layout.pred_col, **more)
        logits = out.logits[0]
    else:
        first, last = int(layout.pred_col.min()), int(layout.pred_col.max())   # only the columns some response
        out = layout.forward(model, logits_to_keep=torch.arange(first, last + 1, device=input_ids.device), **more)
        logits = out.logits[layout.pred_row, layout.pred_col - first]
        logits = ban_placeholders(logits, placeholder_ids(model))   # a VLM's policy never samples them
    layout.aux_loss = getattr(out, "aux_loss", None) if moe_aux else None
    layout.routes = router_replay.outputs(model, plan, layout.response_valid) if plan is not None else None
    return logits, layout


def response_log_probs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       response_width: int, *, temperature: float = 1.0, with_entropy: bool = False,
                       entropy_grad: bool = False, with_sum_pi_squared: bool = False,
                       pack: bool | None = None, gather_ids: torch.Tensor | None = None,
                       vision: dict | None = None, moe_aux: bool = False, routes=None,
                       sp: ulysses.SPGroup | None = None) -> dict[str, torch.Tensor]:
    """log pi(response token) and entropy, both [b, T] float32, 0 on padding (+ sum_v pi(v)^2 when
    with_sum_pi_squared, for the optimal token baseline; + topk_log_prob [b, T, K], the log-probs of
    the token ids `gather_ids` [b, T, K] at each response position, for top-k distillation).
    vision: a vision-language batch's images and M-RoPE positions (rlctl.workers.compute.vision.model_inputs).
    moe_aux: + moe_aux_loss, the MoE router's load-balancing loss (a scalar; rlctl.workers.parallel.moe_aux).
    routes: router_replay.RECORD (+ routed_experts [b, T, L, k]) or a router_replay.Replay (+ its
    mismatch counts): rlctl.workers.parallel.router_replay.
    sp: the engine's sequence-parallel group (rlctl.workers.parallel.ulysses): each rank runs its slice of the
    packed rows, and every rank of the group gets all the outputs.

    temperature divides the logits (the sampling distribution of the rollout). The entropy is
    computed without gradient unless `entropy_grad` (an entropy bonus needs it).
    """
    logits, layout, rows = logits_and_rows(model, input_ids, attention_mask, response_width, pack, vision, moe_aux,
                                           routes, sp=sp)
    valid = layout.response_valid
    bonus = entropy_grad and torch.is_grad_enabled()   # an entropy bonus needs the entropy's gradient
    log_prob, entropy = token_log_probs(logits, rows.local(layout.targets), temperature=temperature,
                                        with_entropy=with_entropy, entropy_grad=bonus)
    result = {"log_prob": _scatter(rows.gather(log_prob), valid)}
    if entropy is not None:
        result["entropy"] = _scatter(rows.gather(entropy), valid)
    if layout.aux_loss is not None:
        result["moe_aux_loss"] = layout.aux_loss
    result.update(layout.routes or {})
    if gather_ids is not None or with_sum_pi_squared:   # options that need the whole float32 distribution
        scaled = logits.float() / temperature if temperature and temperature != 1.0 else logits.float()
        if gather_ids is not None:
            picked = torch.log_softmax(scaled, -1).gather(-1, rows.local(gather_ids[valid].long()))   # [M, K]
            result["topk_log_prob"] = scatter_rows(rows.gather(picked), valid)
        if with_sum_pi_squared:
            from rlctl.algorithms import sum_pi_squared_from_logits

            with torch.no_grad():
                result["sum_pi_squared"] = _scatter(rows.gather(sum_pi_squared_from_logits(scaled)), valid)
    return result


class _AllRows:
    """Without sequence parallelism a rank computes all M response tokens' outputs itself."""

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x


@dataclass
class _SPRows:
    """Under sequence parallelism: this rank's predictors are rows [bounds[r], bounds[r+1]) of the M."""

    sp: ulysses.SPGroup
    bounds: list[int]

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.bounds[self.sp.rank]:self.bounds[self.sp.rank + 1]]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return ulysses.gather_rows(x, self.sp, self.bounds)


def logits_and_rows(model, input_ids, attention_mask, response_width, pack=None, vision=None, moe_aux=False,
                    routes=None, *, sp: ulysses.SPGroup | None = None):
    """(logits [m, V] in the model's output dtype, layout, rows): m = M, or this rank's predictors
    under sequence parallelism (`sp`); rows.local(x) picks those of an [M, ...] tensor, rows.gather(y) puts
    the ranks' [m, ...] outputs together into [M, ...] on every rank."""
    if sp is None:
        logits, layout = response_logits(model, input_ids, attention_mask, response_width, pack=pack, vision=vision,
                                         moe_aux=moe_aux, routes=routes)
        return logits, layout, _AllRows()
    if routes is not None:
        raise ConfigError(f"{router_replay.KEY} is not supported with ulysses_sequence_parallel_size > 1 yet")
    if vision:
        raise DataError("vision-language batches are not supported with ulysses_sequence_parallel_size > 1 yet")
    layout = make_layout(input_ids, attention_mask, response_width, layout="pack")
    out, part = ulysses.sliced_forward(model, sp, layout.input_ids, layout.position_ids, layout.pred_col)
    return out.logits[0], layout, _SPRows(sp, part.bounds)


def response_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_width: int, *, pack: bool | None = None, vision: dict | None = None,
                    sp: ulysses.SPGroup | None = None) -> torch.Tensor:
    """Critic values V(s) [b, T] float32 at the state before each response token, 0 on padding.
    vision, sp: as response_log_probs (the same images and M-RoPE positions as the actor's forward)."""
    layout = make_layout(input_ids, attention_mask, response_width,
                         layout=choose_layout(model, input_ids.shape[1], pack, sp), vision=vision)
    if sp is None:
        values = layout.forward(model).logits[layout.pred_row, layout.pred_col, 0].float()   # [M]
        return _scatter(values, layout.response_valid)
    if vision:
        raise DataError("vision-language batches are not supported with ulysses_sequence_parallel_size > 1 yet")
    out, part = ulysses.sliced_forward(model, sp, layout.input_ids, layout.position_ids, layout.pred_col,
                                       head_only_preds=False)
    rows = _SPRows(sp, part.bounds)
    values = out.logits[0, rows.local(layout.pred_col) - part.start, 0].float()   # this rank's predictors
    return _scatter(rows.gather(values), layout.response_valid)


def scatter_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[M, K] rows back to their [b, T, K] places (0 elsewhere)."""
    out = torch.zeros((*valid.shape, values.shape[-1]), dtype=values.dtype, device=values.device)
    out[valid] = values
    return out


def _scatter(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[M] values back to their [b, T] places (row-major, the order boolean indexing produced)."""
    return torch.zeros(valid.shape, dtype=values.dtype, device=values.device).masked_scatter(valid, values)
