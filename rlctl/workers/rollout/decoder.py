"""Two ways to run a causal LM step by step with a KV cache whose rows can be dropped.

`DecoderRunner` drives Llama-style models (Llama, Qwen2, Qwen3, Mistral) through their own
submodules (norms, projections, MLP), so LoRA layers and the trained weights are used as they
are, but owns the parts that cost time in HF's forward: one preallocated KV buffer written in
place, RoPE tables computed once, GQA decode attention without repeating K/V, no mask building,
and on CPU the plain linear layers packed once per generate (rlctl.workers.rollout.packed).
`HFCacheRunner` (rlctl.workers.rollout.hf_cache) is the fallback for any other architecture: HF
forward with a DynamicCache. `make_runner` picks one.

Both share one protocol: prefill(prompt batch) -> last logits; decode(tokens) -> logits;
select(rows) keeps only those rows (finished sequences stop costing compute). Continuous batching
(rlctl serve, rlctl eval: rows join and leave between steps) adds rows_state(rows) -> those rows'
KV so far, load_rows(states) -> those rows are the live ones, and wants_regroup().
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlctl.models.anatomy import causal_lm_parts, llama_layout
from rlctl.workers.rollout.attention import decode_attention, rope
from rlctl.workers.rollout.hf_cache import HFCacheRunner, join_left
from rlctl.workers.rollout.packed import FusedLinear, linear_or_module


def kv_dtype(weight: torch.Tensor) -> torch.dtype:
    """The KV cache's dtype: the weights' own, or autocast's when it is on (float32 master weights
    under bf16 autocast): attention's matmuls cast K and V to that dtype anyway, so storing them in
    it gives the same numbers at half the bytes, and no cast of the whole cache per step and layer."""
    device = weight.device.type
    if weight.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


class DecoderRunner:
    """Prefill + decode for Llama-style models; the n samples of a prompt share its KV cache.

    Prompt cache kp/vp [layers, B, kv, P, D] is stored once per prompt (left-padded; pad keys get
    a -inf bias); the generated cache holds each live row's own tokens, live rows first (select()
    moves survivors to the front): values vg [layers, rows, kv, T, D], keys kg transposed,
    [layers, rows, kv, D, T], so that the first t generated keys of a row are a [D, t] matrix with
    a plain row stride (a [t, D] slice of a longer buffer, transposed, made bf16 matmuls copy it
    first: 2.2x slower at t = 80). `slot` [A] is each live row's original row, so its prompt is
    slot // n; `in_order` says slot is still 0..B*n-1 (no row has ended), when attention needs no
    scatter into the prompts' layout.
    """

    def __init__(self, lm: torch.nn.Module, max_new_tokens: int, *, rows_hint: int | None = None, pack: bool = True,
                 compile: bool = False):
        self.lm, self.core = lm, lm.model
        self.layers = list(self.core.layers)
        cfg, attn = lm.config, self.layers[0].self_attn
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.group = self.heads // self.kv_heads
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.has_qk_norm = hasattr(attn, "q_norm")
        self.max_new = max_new_tokens
        weight = self.core.embed_tokens.weight
        self.dtype, self.device = kv_dtype(weight), weight.device
        # the linears' dtype as autocast would run them: it casts float32 weights only
        self.linear_dtype = self.dtype if weight.dtype == torch.float32 else weight.dtype
        # the linears are packed once per runner (the first prefill), for rows_hint rows (else
        # that prefill's rows); pack=False keeps every module's own forward (and its hooks: LoRA slots)
        self.rows_hint, self.pack, self.proj = rows_hint, pack, None
        # compile: decode's layers through rlctl.workers.rollout.compiled where it can run (else eager)
        self.compile, self.compiled = compile, None

    def _allocate(self, batch: int, n: int, plen: int) -> None:
        layers, kv, dim = len(self.layers), self.kv_heads, self.head_dim
        new = dict(dtype=self.dtype, device=self.device)
        self.kp, self.vp = (torch.empty(layers, batch, kv, plen, dim, **new) for _ in range(2))
        self._allocate_generated(batch, n, plen)
        if self.proj is None:
            rows = self.rows_hint or batch * n
            # q_norm would undo a scale folded into q's weights
            self.proj = [_Projections(layer, self.linear_dtype, rows, fold_q_scale=not self.has_qk_norm,
                                      pack=self.pack) for layer in self.layers]
            self.head = linear_or_module([self.lm.lm_head], self.linear_dtype, rows, self.pack)
            if self.compile:
                from rlctl.workers.rollout.compiled import CompiledLayers

                self.compiled = CompiledLayers.of(self)

    def _allocate_generated(self, batch: int, n: int, plen: int) -> None:
        """Room for max_new generated tokens of batch * n rows after prompts of width plen."""
        layers, kv, dim = len(self.layers), self.kv_heads, self.head_dim
        new = dict(dtype=self.dtype, device=self.device)
        self.kg = torch.empty(layers, batch * n, kv, dim, self.max_new, **new)
        self.vg = torch.empty(layers, batch * n, kv, self.max_new, dim, **new)
        positions = torch.arange(plen + self.max_new, device=self.device).unsqueeze(0)
        cos, sin = self.core.rotary_emb(self.core.embed_tokens.weight[:1], positions)
        self.cos, self.sin = cos[0], sin[0]  # [P + T, D]
        self.batch, self.n, self.generated = batch, n, 0
        self.slot, self.in_order = torch.arange(batch * n, device=self.device), True

    def _set_prompt(self, valid: torch.Tensor) -> None:
        """The prompts' real columns [B, C] and the attention bias that hides the others."""
        self.prompt_valid = valid
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        self.prompt_bias = torch.where(valid, zero, float("-inf")).view(valid.shape[0], 1, 1, valid.shape[1])

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, n: int,
                past: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Run B left-padded prompts [B, P] once; returns last-position logits [B, V].

        past: (keys, values [layers, B, kv, C, D], valid [B, C]): KV already computed for the
        tokens before each row's input (left-padded; a row without any has no valid column), so
        only the input is run, attending to it. Pad queries may attend to themselves only (never
        to nothing, which would give NaN); real queries see real keys up to themselves.
        """
        batch, plen = input_ids.shape
        cached = 0 if past is None else past[2].shape[1]
        before = 0 if past is None else past[2].sum(-1, keepdim=True)   # [B, 1] real past tokens
        self._allocate(batch, n, cached + plen)
        self._set_prompt(valid if past is None else torch.cat([past[2], valid], dim=-1))
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0) + before
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [B,1,P,D]
        idx = torch.arange(plen, device=self.device)
        causal = idx.unsqueeze(0) <= idx.unsqueeze(1)  # [P(query), P(key)]
        mask = (causal & valid[:, None, :]) | torch.eye(plen, dtype=torch.bool, device=self.device)
        if past is not None:   # every real past key precedes every query of the row
            mask = torch.cat([past[2][:, None, :].expand(batch, plen, cached), mask], dim=-1)
        mask = mask.unsqueeze(1)  # [B, 1, P, C + P]
        h = self.core.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            proj = self.proj[i]
            q, k, v = proj.qkv(layer.input_layernorm(h))
            q = q.view(batch, plen, self.heads, self.head_dim)
            k = k.view(batch, plen, self.kv_heads, self.head_dim)
            v = v.view(batch, plen, self.kv_heads, self.head_dim)
            if self.has_qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            self.kp[i, :, :, cached:], self.vp[i, :, :, cached:] = k, v
            if past is not None:
                self.kp[i, :, :, :cached], self.vp[i, :, :, :cached] = past[0][i], past[1][i]
                k, v = self.kp[i], self.vp[i]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=proj.q_scale, enable_gqa=True)
            h = h + proj.o(out.transpose(1, 2).reshape(batch, plen, -1))
            h = h + proj.mlp(layer.post_attention_layernorm(h))
        return self.head(self.core.norm(h[:, -1]))

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for the live rows: tokens [A], positions [A] -> logits [A, V]."""
        rows, col = tokens.shape[0], self.generated
        self.generated += 1
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [A,1,D]
        h = self.core.embed_tokens(tokens)
        if self.compiled is not None and col > 0:   # column 0 would be a graph of its own (compiled.py)
            return self.head(self.core.norm(self.compiled(h, cos, sin, col)))
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        for i, layer in enumerate(self.layers):
            attn, proj = layer.self_attn, self.proj[i]
            qkv = proj.qkv_joined(layer.input_layernorm(h)).view(rows, heads + 2 * kv, dim)
            if self.has_qk_norm:
                q = rope(attn.q_norm(qkv[:, :heads]), cos, sin)
                k = rope(attn.k_norm(qkv[:, heads:heads + kv]), cos, sin)
            else:   # q and k side by side in the projection's output: one RoPE for both
                qk = rope(qkv[:, :heads + kv], cos, sin)
                q, k = qk[:, :heads], qk[:, heads:]
            self.kg[i, :rows, :, :, col] = k
            self.vg[i, :rows, :, col] = qkv[:, heads + kv:]
            out = decode_attention(q.reshape(rows, kv, self.group, dim), self.kp[i], self.vp[i],
                                   self.kg[i, :rows, :, :, :self.generated], self.vg[i, :rows, :, :self.generated],
                                   self.prompt_bias, None if self.in_order else self.slot, self.n, proj.q_scale)
            h = h + proj.o(out.reshape(rows, -1))
            h = h + proj.mlp(layer.post_attention_layernorm(h))
        return self.head(self.core.norm(h))

    def prompt_kv(self, prompt: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt `prompt`'s real keys and values, [layers, kv, tokens, D] each."""
        cols = self.prompt_valid[prompt]
        return self.kp[:, prompt][:, :, cols], self.vp[:, prompt][:, :, cols]

    def snapshot(self, live: torch.Tensor, rows: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the generated KV of live rows `live` (indices into the live rows), keyed by
        their original row (`rows`: each live row's original row), [layers, kv, generated, D]."""
        cols = self.generated
        return {int(rows[i]): (self.kg[:, i, :, :, :cols].transpose(-1, -2).contiguous(),
                               self.vg[:, i, :, :cols].clone())
                for i in live.tolist()}

    def select(self, keep: torch.Tensor) -> None:
        """Keep live rows `keep` (indices into the live rows, every keep[j] >= j: ascending, or
        rlctl.workers.rollout.hf.keep_order's) as rows 0..len(keep)-1: only the rows that move are
        copied, in place and in order (no source is overwritten before it is read), instead of
        gathering every kept row into a temporary as large as the cache."""
        cols = self.generated
        for j in (keep != torch.arange(len(keep), device=keep.device)).nonzero().squeeze(-1).tolist():
            src = int(keep[j])
            self.kg[:, j, :, :, :cols].copy_(self.kg[:, src, :, :, :cols])
            self.vg[:, j, :, :cols].copy_(self.vg[:, src, :, :cols])
        self.slot = self.slot[keep]
        self.in_order = False

    # ---- continuous batching (rlctl serve): rows join and leave between steps -------------------
    def rows_state(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Live rows `rows` (indices into the live rows; repeats copy a row) as prompts: each row's
        prompt ++ its generated tokens, left-padded: keys, values [layers, R, kv, W, D], valid [R, W]."""
        prompts, g = self.slot[rows] // self.n, self.generated
        keys = torch.cat([self.kp[:, prompts], self.kg[:, rows, :, :, :g].transpose(-1, -2)], dim=3)
        values = torch.cat([self.vp[:, prompts], self.vg[:, rows, :, :g]], dim=3)
        valid = torch.cat([self.prompt_valid[prompts], self.prompt_valid.new_ones(len(rows), g)], dim=1)
        return keys, values, valid

    def load_rows(self, states: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """The live rows become those of `states` (rows_state's), in order, their tokens so far
        held as prompts (n = 1): room for max_new more tokens each, prompt padding trimmed."""
        valid, start = join_left([s[2] for s in states], 1)
        self.kp = join_left([s[0] for s in states], 3, start, rows=1)[0]
        self.vp = join_left([s[1] for s in states], 3, start, rows=1)[0]
        self._set_prompt(valid)
        self._allocate_generated(valid.shape[0], 1, valid.shape[1])

    def wants_regroup(self) -> bool:
        """A regroup (load_rows of the live rows) is due: no room for another token, or most
        prompts in the cache belong to rows that left (attention still reads them)."""
        return self.generated >= self.max_new or 2 * len(self.slot) <= self.batch * self.n


class _Projections:
    """One decoder layer's linear layers as the runner calls them: qkv(x) -> (q, k, v),
    qkv_joined(x) -> [..., q ++ k ++ v], o(x), and mlp(x) = down(act(gate(x)) * up(x)) (the
    layer's own MLP forward where it is not that shape), each packed once for this generate where
    rlctl.workers.rollout.packed can.

    fold_q_scale: multiply the attention scale into the packed q weights where that is exact (a
    power of two, as 1/8 for head_dim 64: the scores are then bitwise the unscaled ones times it);
    q_scale is what attention must still apply (1.0 when folded, else the attention scale)."""

    def __init__(self, layer: torch.nn.Module, dtype: torch.dtype, rows: int, fold_q_scale: bool = False,
                 pack: bool = True):
        attn, mlp = layer.self_attn, layer.mlp
        modules, scale = [attn.q_proj, attn.k_proj, attn.v_proj], float(attn.scaling)
        folded = (FusedLinear.of(modules, dtype, rows, row_scale=(scale, 1.0, 1.0))
                  if pack and fold_q_scale and _power_of_two(scale) else None)
        self.qkv = folded if folded is not None else linear_or_module(modules, dtype, rows, pack)
        self.q_scale = 1.0 if folded is not None else scale
        self.o = linear_or_module([attn.o_proj], dtype, rows, pack)
        self.mlp, self.gate_up, self.down, self.act = mlp, None, None, None
        if all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            gate_up = linear_or_module([mlp.gate_proj, mlp.up_proj], dtype, rows, pack)
            down, act = linear_or_module([mlp.down_proj], dtype, rows, pack), mlp.act_fn
            self.gate_up, self.down, self.act = gate_up, down, act

            def gated(x: torch.Tensor) -> torch.Tensor:
                gate, up = gate_up(x)
                return down(act(gate) * up)

            self.mlp = gated

    def qkv_joined(self, x: torch.Tensor) -> torch.Tensor:
        """q ++ k ++ v along the last dim: the packed matmul's output itself, else the three joined."""
        if isinstance(self.qkv, FusedLinear):
            return self.qkv.joined(x)
        return torch.cat(self.qkv(x), dim=-1)


def _power_of_two(factor: float) -> bool:
    """Multiplying by `factor` is exact in binary floating point."""
    return factor > 0 and math.frexp(factor)[0] == 0.5


def make_runner(model: torch.nn.Module, max_new_tokens: int, max_len: int, *, fast: bool = True,
                vision: bool = False, **options) -> "DecoderRunner | HFCacheRunner":
    """The runner for `model`: DecoderRunner for a Llama-style text model (options: its rows_hint,
    pack), HF forward otherwise (or when not `fast`)."""
    lm = causal_lm_parts(model)
    if fast and not vision and llama_layout(lm, max_len):
        return DecoderRunner(lm, max_new_tokens, **options)
    return HFCacheRunner(model)


def left_pad(prompt_ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> input_ids [B, P] left-padded with pad_id and valid [B, P] (True = real token).
    Left padding lines every prompt's last token up in column P-1, where decoding continues."""
    plen = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), plen), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompt_ids), plen), dtype=torch.bool)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, plen - len(ids):] = torch.as_tensor(ids, dtype=torch.long)
        valid[row, plen - len(ids):] = True
    return input_ids.to(device), valid.to(device)
