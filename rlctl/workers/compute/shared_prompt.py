"""Shared-prompt forward passes: the n samples of a prompt reuse one pass over the prompt.

GRPO-style batches hold n responses per prompt. Run row by row, every prompt token goes through
the model n times (8x for n = 8), although its hidden states are the same in every row: a
response token only reads the prompt through attention. So the micro-batch is packed into one
row [1, N], each distinct prompt once followed by the responses that continue it:

    [prompt_g | response_r1 | response_r2 | ... ]   for every prompt group g
    position_ids: prompt 0..P_g-1, each response P_g..P_g+T_r-1 (as if it followed its prompt)

and attention (a transformers attention function, so every layer's own projections, norms, MLP,
LoRA adapters and FSDP hooks run unchanged) lets prompt tokens see their prompt causally and
response tokens see their prompt plus their own earlier tokens. The result is the row-by-row one
(the same math, float summation order aside) for N = sum P_g + sum T_r tokens instead of
sum (P_r + T_r); gradients flowing into a shared prompt sum over its responses, as they would.
Works for Llama-style models (rlctl.models.anatomy.llama_layout); others keep
the row-by-row layouts of rlctl.workers.compute.logprob. Gradient checkpointing recomputes layers in
backward, after `attention` has handed the model its own attention back: models checkpointed
with `checkpoint_kwargs` re-enter it for the recompute; others fall back to row-by-row.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlctl.models.anatomy import attention_as, causal_lm_parts, llama_layout

ATTENTION = "rlctl_shared_prompt"
KWARG = "rlctl_shared_prompt"
# On CPU, bfloat16 / float16 attention runs as plain matmuls (_grouped_attention): torch's CPU
# scaled_dot_product_attention is several times slower backward in half precision than in float32
# for the many short rows here, while half-precision matmuls are the fastest path there
# (docs/benchmarks.md, the real-model GRPO step).
CPU_HALF = (torch.bfloat16, torch.float16)


@dataclass
class SharedPrompt:
    """Where each group's prompt and each row's response sit in the packed row of N tokens."""

    prompt_index: torch.Tensor    # [G, Pm] packed position of prompt token i of group g (0 on padding)
    response_index: torch.Tensor  # [R, Tm] packed position of response token j of row r (0 on padding)
    group_of: torch.Tensor        # [R] the prompt group of each row
    response_bias: torch.Tensor   # [R, 1, Tm, Pm+Tm] bool: what response query j may attend to
    inverse: torch.Tensor         # [N] where packed token t sits in [prompt outputs ++ response outputs]


def supported(model: torch.nn.Module, max_len: int) -> bool:
    """Llama-style attention through transformers' attention interface (causal LMs and their token
    classifiers keep the decoder stack at `.model`), no gradient checkpointing."""
    lm = causal_lm_parts(model)
    checkpointed = any(getattr(m, "gradient_checkpointing", False) is True for m in lm.modules())
    if checkpointed and not getattr(lm, "_rlctl_shared_recompute", False):
        return False
    return llama_layout(lm, max_len)


def attention(model: torch.nn.Module):
    """Route the model's attention through `shared_prompt_attention` for one forward call."""
    return _routed(causal_lm_parts(model).config)


def _routed(config):
    return attention_as(config, ATTENTION, shared_prompt_attention)


def checkpoint_kwargs(model: torch.nn.Module) -> dict:
    """torch.utils.checkpoint arguments for `gradient_checkpointing_enable`: a layer whose forward
    ran shared-prompt attention recomputes under it too (context_fn's second context)."""
    lm = causal_lm_parts(model)
    config = lm.config

    def context_fn():
        shared = config._attn_implementation == ATTENTION
        return contextlib.nullcontext(), (_routed(config) if shared else contextlib.nullcontext())

    lm._rlctl_shared_recompute = True
    return {"use_reentrant": False, "context_fn": context_fn}


def pack(input_ids: torch.Tensor, valid: torch.Tensor, response_width: int):
    """Rows [b, P+T] (left-padded prompt, right-padded response) -> packed ids and positions [1, N],
    the SharedPrompt plan, and pred [M]: for each real response token (row-major, the order of
    boolean indexing), the packed position of the token that predicts it (its prompt's last token
    for a response's first token). Rows with the same prompt share a group."""
    b, width = input_ids.shape
    plen_cols = width - response_width
    prompt_valid, response_valid = valid[:, :plen_cols], valid[:, plen_cols:]
    key = torch.where(prompt_valid, input_ids[:, :plen_cols], -1)
    _, group_of = torch.unique(key, dim=0, return_inverse=True)        # [b] group id per row
    groups = int(group_of.max()) + 1
    ids, pos, prompt_start, prompt_len = [], [], [0] * groups, [0] * groups
    response_start, cursor = [0] * b, 0
    for g in range(groups):
        rows = torch.nonzero(group_of == g).flatten().tolist()
        prompt = input_ids[rows[0], :plen_cols][prompt_valid[rows[0]]]
        prompt_start[g], prompt_len[g] = cursor, len(prompt)
        ids.append(prompt)
        pos.append(torch.arange(len(prompt)))
        cursor += len(prompt)
        for r in rows:
            response = input_ids[r, plen_cols:][response_valid[r]]
            ids.append(response)
            pos.append(torch.arange(len(prompt), len(prompt) + len(response)))
            response_start[r] = cursor
            cursor += len(response)
    device = input_ids.device
    plan, pred = _plan(torch.tensor(prompt_start), torch.tensor(prompt_len), torch.tensor(response_start),
                       response_valid.sum(1).cpu(), group_of.cpu(), cursor)
    plan = SharedPrompt(*(t.to(device) for t in (plan.prompt_index, plan.response_index, plan.group_of,
                                                  plan.response_bias, plan.inverse)))
    return torch.cat(ids)[None], torch.cat(pos).to(device)[None], plan, pred.to(device)


def _plan(prompt_start, prompt_len, response_start, response_len, group_of, tokens: int):
    """Index tensors of the packed layout (see SharedPrompt), and the predictor positions [M]."""
    pm, tm = int(prompt_len.max()), max(1, int(response_len.max()))
    cols_p, cols_t = torch.arange(pm), torch.arange(tm)
    prompt_ok = cols_p[None] < prompt_len[:, None]                     # [G, Pm]
    response_ok = cols_t[None] < response_len[:, None]                 # [R, Tm]
    prompt_index = torch.where(prompt_ok, prompt_start[:, None] + cols_p[None], 0)
    response_index = torch.where(response_ok, response_start[:, None] + cols_t[None], 0)
    inverse = torch.zeros(tokens, dtype=torch.long)
    inverse[prompt_index[prompt_ok]] = torch.arange(prompt_index.numel()).view_as(prompt_index)[prompt_ok]
    inverse[response_index[response_ok]] = (prompt_index.numel()
                                             + torch.arange(response_index.numel()).view_as(response_index)[response_ok])
    causal = torch.ones(tm, tm, dtype=torch.bool).tril()
    bias = torch.cat([prompt_ok[group_of][:, None, :].expand(-1, tm, -1),
                      causal[None].expand(len(group_of), -1, -1)], dim=-1)[:, None]  # [R, 1, Tm, Pm+Tm]
    last_prompt = (prompt_start + prompt_len - 1)[group_of]           # [R]
    pred = torch.where(cols_t[None] == 0, last_prompt[:, None], response_index - 1)[response_ok]
    return SharedPrompt(prompt_index, response_index, group_of, bias, inverse), pred


def shared_prompt_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs):
    """transformers attention function for a packed SharedPrompt row.

    query [1, H, N, D], key/value [1, KV, N, D] (RoPE applied) -> output [1, N, H, D].
    Prompts: [G, H, Pm, D] causal (right-padded, so padding never precedes a real key).
    Responses: [R, H, Tm, D] against [own prompt keys ++ own keys] [R, KV, Pm+Tm, D].
    """
    plan: SharedPrompt = kwargs[KWARG]
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)   # [N, *, D]
    heads, dim = q.shape[1], q.shape[2]

    def gather(x, index):   # [N, h, D] -> [rows, h, cols, D]; index_select: its backward is index_add_
        return x.index_select(0, index.flatten()).view(*index.shape, x.shape[1], dim).transpose(1, 2)

    attend = _grouped_attention if query.device.type == "cpu" and _half(query.dtype) else _sdpa
    kp, vp = gather(k, plan.prompt_index), gather(v, plan.prompt_index)
    prompt_out = attend(gather(q, plan.prompt_index), kp, vp, None, scaling)   # causal
    keys = torch.cat([kp.index_select(0, plan.group_of), gather(k, plan.response_index)], dim=2)
    values = torch.cat([vp.index_select(0, plan.group_of), gather(v, plan.response_index)], dim=2)
    response_out = attend(gather(q, plan.response_index), keys, values, plan.response_bias, scaling)
    flat = torch.cat([prompt_out.transpose(1, 2).reshape(-1, heads, dim),
                      response_out.transpose(1, 2).reshape(-1, heads, dim)])
    return flat.index_select(0, plan.inverse)[None], None


def _half(dtype: torch.dtype) -> bool:
    """Half-precision attention: half inputs, or float32 ones (RoPE's float32 cos/sin promote q and k)
    under a half-precision CPU autocast, whose matmuls then run in half precision."""
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in CPU_HALF
    return dtype in CPU_HALF or autocast


def _sdpa(query, key, value, allowed, scaling):
    """torch's attention; `allowed` None = causal."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, is_causal=allowed is None,
                                          scale=scaling, enable_gqa=True)


def _grouped_attention(query, key, value, allowed, scaling):
    """Attention as matmuls, the query heads of one KV head stacked into one matrix: [B, H, L, D] queries,
    [B, KV, S, D] keys and values, `allowed` [B or 1, 1, L, S] (None = causal) -> [B, H, L, D]; the
    softmax in float32. No row here is fully masked (every query sees its prompt's first token)."""
    b, heads, length, dim = query.shape
    kv = key.shape[1]
    if allowed is None:
        allowed = torch.ones(length, key.shape[2], dtype=torch.bool, device=query.device).tril()[None, None]
    grouped = query.reshape(b, kv, heads // kv * length, dim)
    scores = (grouped @ key.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)
    scores = scores.view(b, kv, heads // kv, length, -1).masked_fill(~allowed[:, :, None], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype).view(b, kv, heads // kv * length, -1)
    return (probs @ value).view(b, heads, length, dim)
