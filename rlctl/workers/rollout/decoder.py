"""Two ways to run a causal LM step by step with a KV cache whose rows can be dropped.

`DecoderRunner` drives Llama-style models (Llama, Qwen2, Qwen3, Mistral) through their own
submodules (norms, projections, MLP), so LoRA layers and the trained weights are used as they
are, but owns the parts that cost time in HF's forward: one preallocated KV buffer written in
place, RoPE tables computed once, GQA decode attention without repeating K/V, no mask building.
`HFCacheRunner` is the fallback for any other architecture: HF forward with a DynamicCache.

Both share one protocol: prefill(prompt batch) -> last logits; decode(tokens) -> logits;
select(rows) keeps only those rows (finished sequences stop costing compute).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def causal_lm_parts(model: torch.nn.Module) -> torch.nn.Module:
    """The HF *ForCausalLM under a peft wrapper (LoRA layers stay in place inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def fast_path_supported(lm: torch.nn.Module, max_len: int) -> bool:
    """True when `lm` has the Llama layout DecoderRunner relies on and no sliding window bites."""
    cfg = getattr(lm, "config", None)
    core = getattr(lm, "model", None)
    if cfg is None or core is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return False
    if not all(hasattr(core, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    return window is None or window >= max_len


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin (the HF convention: halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for one new token: q [A, kv, G, D], k/v [A, kv, L, D] (strided
    views of the cache), key_valid [A, 1, 1, L]. Two batched matmuls: for so few queries they
    beat SDPA's flash kernel on CPU (which is built for long query blocks)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~key_valid, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class DecoderRunner:
    """Prefill + decode for Llama-style models with a static, row-compactable KV cache.

    Cache: k/v [layers, rows, kv_heads, max_len, head_dim]. Prompts are left-padded to P, so
    column c holds position c - pad for every row; `key_valid` [rows, max_len] marks real keys.
    Active rows always occupy the buffer's first rows; select() moves survivors to the front.
    """

    def __init__(self, lm: torch.nn.Module, rows: int, max_len: int):
        self.lm, self.core = lm, lm.model
        self.layers = list(self.core.layers)
        cfg, attn = lm.config, self.layers[0].self_attn
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.has_qk_norm = hasattr(attn, "q_norm")
        weight = self.core.embed_tokens.weight
        self.dtype, self.device = weight.dtype, weight.device
        shape = (len(self.layers), rows, self.kv_heads, max_len, self.head_dim)
        self.k = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.v = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.key_valid = torch.ones(rows, max_len, dtype=torch.bool, device=self.device)
        positions = torch.arange(max_len, device=self.device).unsqueeze(0)
        cos, sin = self.core.rotary_emb(weight[:1], positions)  # [1, max_len, head_dim]
        self.cos, self.sin = cos[0], sin[0]
        self.rows, self.length = 0, 0

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
        """Run B left-padded prompts [B, P] once; their K/V fill n cache rows each (prompt-major).

        Pad queries may attend to themselves only (never to nothing, which would give NaN);
        real queries see real keys up to themselves. Returns last-position logits [B, V].
        """
        batch, plen = input_ids.shape
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [B,1,P,D]
        idx = torch.arange(plen, device=self.device)
        causal = idx.unsqueeze(0) <= idx.unsqueeze(1)  # [P(query), P(key)]
        mask = (causal & valid[:, None, :]) | torch.eye(plen, dtype=torch.bool, device=self.device)
        mask = mask.unsqueeze(1)  # [B, 1, P, P]
        self.rows, self.length = batch * n, plen
        self.key_valid[: self.rows, :plen] = valid.repeat_interleave(n, dim=0)
        self.key_valid[: self.rows, plen:] = True
        h = self.core.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(batch, plen, self.heads, self.head_dim)
            k = attn.k_proj(x).view(batch, plen, self.kv_heads, self.head_dim)
            v = attn.v_proj(x).view(batch, plen, self.kv_heads, self.head_dim)
            if self.has_qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            # the n samples of a prompt share its K/V: write each prompt's block n times
            self.k[i, : self.rows].view(batch, n, *self.k.shape[2:])[:, :, :, :plen] = k.unsqueeze(1)
            self.v[i, : self.rows].view(batch, n, *self.v.shape[2:])[:, :, :, :plen] = v.unsqueeze(1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(batch, plen, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm.lm_head(self.core.norm(h[:, -1]))

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for the active rows: tokens [A], positions [A] -> logits [A, V].

        Decode attention groups the query heads by KV head, q [A, kv_heads, G, D] against
        K [A, kv_heads, L, D], so K/V are read once per KV head instead of repeated G times.
        """
        rows, col = tokens.shape[0], self.length
        self.length += 1
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [A,1,D]
        mask = self.key_valid[:rows, : self.length].view(rows, 1, 1, self.length)
        group = self.heads // self.kv_heads
        h = self.core.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(rows, self.heads, self.head_dim)
            k = attn.k_proj(x).view(rows, self.kv_heads, self.head_dim)
            if self.has_qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            self.k[i, :rows, :, col] = _rope(k, cos, sin)
            self.v[i, :rows, :, col] = attn.v_proj(x).view(rows, self.kv_heads, self.head_dim)
            q = _rope(q, cos, sin).view(rows, self.kv_heads, group, self.head_dim)
            out = _decode_attention(q, self.k[i, :rows, :, : self.length],
                                    self.v[i, :rows, :, : self.length], mask, self.scale)
            h = h + attn.o_proj(out.reshape(rows, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm.lm_head(self.core.norm(h))

    def select(self, keep: torch.Tensor) -> None:
        """Keep rows `keep` (indices into the active rows, ascending), moved to the front."""
        cols = self.length
        self.k[:, : len(keep), :, :cols] = self.k[:, keep, :, :cols]
        self.v[:, : len(keep), :, :cols] = self.v[:, keep, :, :cols]
        self.key_valid[: len(keep)] = self.key_valid[keep]
        self.rows = len(keep)


class HFCacheRunner:
    """Any HF causal LM: its own forward with a DynamicCache (slower, but always right)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = None
        self.mask = None

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        mask = valid.long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.cache.batch_repeat_interleave(n)
        self.mask = mask.repeat_interleave(n, dim=0)
        return out.logits[:, -1]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=-1)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask,
                         position_ids=positions.unsqueeze(-1), past_key_values=self.cache,
                         use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
