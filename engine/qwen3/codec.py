"""The 12Hz codec decoder (code2wav): 16 codebooks per frame → 1920 samples at 24 kHz.

split RVQ (1 semantic + 15 acoustic) → causal conv → sliding-window transformer → 2 × (trans-conv ×2 +
ConvNeXt) → causal conv → 4 × (SnakeBeta, trans-conv ×r, 3 dilated residual units) → SnakeBeta → conv → clamp.

Two paths over the same weights:
- `forward(codes)`: the whole sequence at once (zero left padding, window mask), like the reference.
- `step(codes, state)`: a chunk of frames continuing a `CodecState` exactly: every causal conv keeps its
  last (k-1)·d input samples, every trans-conv its overlap tail (without bias, which is added once on
  emission), every transformer layer the RoPE'd keys/values of the last `window-1` frames, plus the
  frame position. Initial state is zeros, which is what the full path's padding means, so any chunk
  schedule reproduces `forward` (up to float summation order).
Parameter names follow `decoder.*` in `speech_tokenizer/model.safetensors`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.qwen3.config import CodecDecoderConfig
from engine.qwen3.layers import MLP, Attention, RMSNorm, rope_cos_sin, rope_inv_freq


@dataclass
class CodecState:
    """Per-stream decoder state, batched over streams on dim 0 of every tensor."""

    buffers: dict[str, torch.Tensor]
    pos: torch.Tensor  # [B] frames decoded so far (the next frame's RoPE position)

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    def rows(self, idx: torch.Tensor | list[int]) -> CodecState:
        """A copy holding only streams `idx` (to batch streams of equal chunk size together)."""
        i = torch.as_tensor(idx, dtype=torch.long, device=self.pos.device)
        return CodecState({k: v[i].clone() for k, v in self.buffers.items()}, self.pos[i].clone())

    def put(self, idx: torch.Tensor | list[int], other: CodecState) -> None:
        """Write `other` back into streams `idx`."""
        i = torch.as_tensor(idx, dtype=torch.long, device=self.pos.device)
        for k, v in self.buffers.items():
            v[i] = other.buffers[k]
        self.pos[i] = other.pos

    def reset(self, idx: torch.Tensor | list[int]) -> None:
        """Start streams `idx` over (a freed slot taken by a new stream)."""
        i = torch.as_tensor(idx, dtype=torch.long, device=self.pos.device)
        for v in self.buffers.values():
            v[i] = 0
        self.pos[i] = 0

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.buffers.values())


class Stateful(nn.Module):
    """A module with per-stream streaming state; `state_key` is its path, set by CodecDecoder."""

    state_key: str = ""

    def state_shape(self, batch: int) -> tuple[int, ...] | None:
        raise NotImplementedError


class CausalConv(Stateful):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.history = (kernel - 1) * dilation

    def state_shape(self, batch: int) -> tuple[int, ...] | None:
        return (batch, self.conv.in_channels, self.history) if self.history else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.history, 0)))

    def stream(self, x: torch.Tensor, state: CodecState) -> torch.Tensor:
        if not self.history:
            return self.conv(x)
        hist = state.buffers[self.state_key]
        xx = torch.cat((hist, x), dim=-1)
        hist.copy_(xx[..., -self.history:])
        return self.conv(xx)


class CausalTransConv(Stateful):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride, self.overlap = stride, kernel - stride

    def state_shape(self, batch: int) -> tuple[int, ...] | None:
        return (batch, self.conv.out_channels, self.overlap) if self.overlap else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.overlap] if self.overlap else y

    def stream(self, x: torch.Tensor, state: CodecState) -> torch.Tensor:
        if not self.overlap:
            return self.conv(x)
        tail = state.buffers[self.state_key]
        y = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)
        y[..., : self.overlap] += tail
        n = x.shape[-1] * self.stride
        tail.copy_(y[..., n:])
        assert self.conv.bias is not None
        return y[..., :n] + self.conv.bias[:, None]


class SnakeBeta(nn.Module):
    """x + 1/β · sin²(αx), with α and β stored as logs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def _pointwise(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise(x, self.dwconv(x))

    def stream(self, x: torch.Tensor, state: CodecState) -> torch.Tensor:
        return self._pointwise(x, self.dwconv.stream(x, state))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def stream(self, x: torch.Tensor, state: CodecState) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1.stream(self.act1(x), state)))


class DecoderBlock(nn.Module):
    """SnakeBeta → trans-conv ×rate (channels halve) → residual units with dilations 1, 3, 9."""

    def __init__(self, c_in: int, rate: int) -> None:
        super().__init__()
        c_out = c_in // 2
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate)]
            + [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x

    def stream(self, x: torch.Tensor, state: CodecState) -> torch.Tensor:
        x = self.block[0](x)
        for m in self.block[1:]:
            x = m.stream(x, state)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class CodecTransformerLayer(Stateful):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = Attention(h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                   cfg.rms_norm_eps, qk_norm=False)
        self.mlp = MLP(h, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.memory = cfg.sliding_window - 1  # frames of keys a new frame can still see

    def state_shape(self, batch: int) -> tuple[int, ...] | None:
        a = self.self_attn
        return (batch, 2, a.kv_heads, self.memory, a.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                state: CodecState | None = None) -> torch.Tensor:
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        if state is not None:  # prepend the window carried from earlier chunks, keep the newest for later
            kv = state.buffers[self.state_key]
            k = torch.cat((kv[:, 0], k), dim=2)
            v = torch.cat((kv[:, 1], v), dim=2)
            kv[:, 0].copy_(k[:, :, -self.memory:])
            kv[:, 1].copy_(v[:, :, -self.memory:])
        x = x + self.self_attn_layer_scale(self.self_attn.attend(q, k, v, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class CodecTransformer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CodecTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.window, self.rope_theta = cfg.sliding_window, cfg.rope_theta
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor, state: CodecState | None = None) -> torch.Tensor:
        """x [B, T, latent] → [B, T, latent]; with `state`, frames continue at state.pos."""
        b, t, _ = x.shape
        start = state.pos if state is not None else torch.zeros(b, dtype=torch.long, device=x.device)
        q_pos = start[:, None] + torch.arange(t, device=x.device)  # [B, T]
        memory = self.window - 1 if state is not None else 0
        k_pos = start[:, None] - memory + torch.arange(memory + t, device=x.device)  # [B, memory + T]
        qp, kp = q_pos[:, :, None], k_pos[:, None, :]
        mask = ((kp <= qp) & (kp > qp - self.window) & (kp >= 0))[:, None]
        h = self.input_proj(x)
        cos, sin = rope_cos_sin(q_pos, self.inv_freq, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state)
        return self.output_proj(self.norm(h))


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    def __init__(self, n_q: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(VectorQuantization(size, dim) for _ in range(n_q))
        # input_proj only serves the encoder; it is loaded so the checkpoint's keys match exactly.
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.register_buffer("codebooks", torch.zeros(n_q, size, dim), persistent=False)

    def refresh(self) -> None:
        """Codebook vectors are embedding_sum / usage; computed once after loading, not per frame."""
        vecs = [layer._codebook.embedding_sum / layer._codebook.cluster_usage.clamp(min=1e-5)[:, None]
                for layer in self.vq.layers]
        self.codebooks = torch.stack(vecs).detach()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n_q, T] → [B, io_dim, T]."""
        q = F.embedding(codes[:, 0], self.codebooks[0]).transpose(1, 2)
        for i in range(1, codes.shape[1]):
            q = q + F.embedding(codes[:, i], self.codebooks[i]).transpose(1, 2)
        return self.output_proj(q)


class SplitRVQ(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.n_semantic = cfg.num_semantic_quantizers
        self.rvq_first = ResidualVQ(self.n_semantic, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - self.n_semantic, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        n = self.n_semantic
        return self.rvq_first.decode(codes[:, :n]) + self.rvq_rest.decode(codes[:, n:])


class CodecDecoder(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.samples_per_frame = cfg.total_upsample
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = CodecTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [DecoderBlock(dims[i], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        )
        for name, m in self.named_modules():
            if isinstance(m, Stateful):
                m.state_key = name

    def refresh(self) -> None:
        """Recompute derived tensors after the weights change (the loader calls this)."""
        self.quantizer.rvq_first.refresh()
        self.quantizer.rvq_rest.refresh()

    def _check(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.ndim != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        return codes.clamp(min=0)  # the reference pads with -1

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] → waveform [B, T·1920] in [-1, 1]."""
        codes = self._check(codes)
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for trans, convnext in self.upsample:
            h = convnext(trans(h))
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1, 1)[:, 0]

    def new_state(self, batch: int = 1) -> CodecState:
        p = self.quantizer.rvq_first.output_proj.weight
        buffers = {}
        for m in self.modules():
            if isinstance(m, Stateful) and (shape := m.state_shape(batch)) is not None:
                buffers[m.state_key] = torch.zeros(shape, dtype=p.dtype, device=p.device)
        return CodecState(buffers, torch.zeros(batch, dtype=torch.long, device=p.device))

    def step(self, codes: torch.Tensor, state: CodecState) -> torch.Tensor:
        """The next chunk codes [B, 16, n] of B streams → waveform [B, n·1920]; `state` advances in place."""
        codes = self._check(codes)
        if codes.shape[0] != state.batch:
            raise ValueError(f"codes for {codes.shape[0]} streams, state for {state.batch}")
        h = self.pre_conv.stream(self.quantizer.decode(codes), state)
        h = self.pre_transformer(h.transpose(1, 2), state).transpose(1, 2)
        state.pos += codes.shape[-1]
        for trans, convnext in self.upsample:
            h = convnext.stream(trans.stream(h, state), state)
        h = self.decoder[0].stream(h, state)
        for block in self.decoder[1:-2]:
            h = block.stream(h, state)
        h = self.decoder[-1].stream(self.decoder[-2](h), state)
        return h.clamp(-1, 1)[:, 0]
