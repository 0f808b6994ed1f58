"""The Qwen3 decoder layer shared by the talker and the code predictor, with a static KV cache.

The cache is preallocated per slot (`[layers, slots, kv_heads, max_len, head_dim]`) and every forward
takes explicit per-row positions and slot ids: a row writes its keys at its own positions, and attends to
cache entries whose position is <= its query position. Entries past a row's length may hold stale data
from a previous occupant of the slot; the position mask never lets a row see them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, as the reference does (matters in bf16).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [B, 1, T, head_dim] for integer positions [B, T] (computed in fp32)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain masked softmax attention. On CPU, torch's flash kernel costs milliseconds per call at decode
    shapes (measured ~6 ms for one 64-wide row); two small matmuls cost microseconds."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype)
    return probs @ v


class KVCache:
    """Preallocated keys/values for `slots` sequences of up to `max_len` positions, all layers."""

    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, qk_norm: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm: nn.Module = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, T, D], k and v [B, KV, T, D] with q/k-norm and RoPE applied."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D] over k, v [B, KV, L, D] where mask [B, 1, T, L] is true."""
        if q.device.type == "cpu":
            out = eager_attention(q, k, v, mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block: RMSNorm → GQA attention with q/k-norm and RoPE → RMSNorm → SwiGLU."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps, qk_norm=True)
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, kv_len: int,
                mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        # Write this step's keys at each row's own positions, then read the slot's prefix back.
        idx_slot = slots[:, None]
        k_cache[idx_slot, :, positions] = k.transpose(1, 2).to(k_cache.dtype)
        v_cache[idx_slot, :, positions] = v.transpose(1, 2).to(v_cache.dtype)
        keys = k_cache[slots, :, :kv_len]
        values = v_cache[slots, :, :kv_len]
        x = x + self.self_attn.attend(q, keys, values, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """`layers` + final `norm`, run against a KVCache with explicit slots and positions."""

    def __init__(self, n_layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float, rope_theta: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(hidden, intermediate, heads, kv_heads, head_dim, eps) for _ in range(n_layers)
        )
        self.norm = RMSNorm(hidden, eps)
        self.head_dim, self.kv_heads, self.rope_theta = head_dim, kv_heads, rope_theta
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, rope_theta), persistent=False)

    def new_cache(self, slots: int, max_len: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        w = self.norm.weight
        return KVCache(len(self.layers), slots, self.kv_heads, max_len, self.head_dim,
                       dtype or w.dtype, device or w.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                kv_len: int | None = None) -> torch.Tensor:
        """x [B, T, hidden] at integer positions [B, T] of cache slots [B] → normed hidden [B, T, hidden].

        `kv_len` bounds the keys read (default: the largest position + 1); pass a fixed bucket to keep
        shapes static.
        """
        if kv_len is None:
            kv_len = int(positions.max()) + 1
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        key_pos = torch.arange(kv_len, device=x.device)
        mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, kv_len]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], slots, positions, kv_len, mask)
        return self.norm(x)
