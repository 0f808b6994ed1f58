"""The speech tokenizer's encoder (Mimi): 24 kHz mono audio → codec frames [frames, 16] at 12.5 frames/s.

Base-model ICL cloning feeds the reference clip's frames (`ref_code`) into the prompt. Pipeline, as the
official `Qwen3TTSTokenizerV2Model.encode` runs transformers' `MimiModel.encode`:

    SEANet conv encoder (causal convs, ELU, one residual block per stage, strides 4·5·6·8 = 960 samples)
    → causal transformer (LayerNorm, RoPE, GELU MLP, LayerScale; no final norm)
    → stride-2 causal conv (replicate-padded) to 1920 samples per frame
    → split RVQ: 1 semantic codebook, then the acoustic RVQ on the same embedding; keep the first
      `encoder_valid_num_quantizers` (16) of `num_quantizers` (32 in the real file)
    → frames [ceil(samples / 1920), 16].

Every causal conv pads (kernel - stride) on the left and zeros on the right up to a whole number of
strides, so T samples give ceil(T / 1920) frames. The transformer attends to all earlier frames: the
config's `sliding_window` (250) is not applied by the official stack (transformers 4.57's Mimi builds a
plain causal mask), and parity with it is the point. Parameter names follow `encoder.*` in
`speech_tokenizer/model.safetensors`; `output_proj` (decode side) and `initialized` are kept only so the
file loads strictly. Inference only, one clip at a time.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.qwen3.codec import LayerScale
from engine.qwen3.config import MimiEncoderConfig, SpeechTokenizerConfig
from engine.qwen3.layers import Attention, rope_cos_sin, rope_inv_freq
from engine.qwen3.weights import load_module
from engine.resample import resample

SAMPLE_RATE = 24000


class MimiConv(nn.Module):
    """Causal Conv1d: (dilated kernel - stride) samples of left padding, then right padding up to a whole
    number of strides, so L samples give ceil(L / stride) outputs."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.left = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        right = -(-length // self.stride) * self.stride - length
        return self.conv(F.pad(x, (self.left, right), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    """ELU → conv k (dilated) to dim/compress → ELU → conv 1 back to dim, plus the identity."""

    def __init__(self, cfg: MimiEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        # ELUs sit at indices 0 and 2 so the convs keep the checkpoint's `block.1` / `block.3` names.
        self.block = nn.ModuleList([nn.ELU(), MimiConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                                    nn.ELU(), MimiConv(hidden, dim, 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in self.block:
            h = m(h)
        return x + h


class SEANetEncoder(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [MimiConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        dim = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):  # the decoder's upsampling, read backwards
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate ** j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), MimiConv(dim, dim * 2, kernel=ratio * 2, stride=ratio)]
            dim *= 2
        layers += [nn.ELU(), MimiConv(dim, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers:
            x = m(x)
        return x


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate, bias=False)
        self.fc2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MimiTransformerLayer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = Attention(h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attention_head_dim,
                                   cfg.norm_eps, qk_norm=False)
        self.mlp = GeluMLP(h, cfg.intermediate_size)
        self.input_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn
        q, k, v = attn.project(self.input_layernorm(x), cos, sin)
        if attn.heads != attn.kv_heads:
            k = k.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
            v = v.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
        # SDPA with is_causal, as the reference runs it: the same kernel gives the same bits, and the codes
        # are argmins that a last-bit difference could flip.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, _, t, _ = out.shape
        x = x + self.self_attn_layer_scale(attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class MimiTransformer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MimiTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.rope_theta = cfg.rope_theta
        self.register_buffer("inv_freq", rope_inv_freq(cfg.attention_head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] at positions 0..T-1 → [B, T, hidden]."""
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """Centroids `embed_sum / cluster_usage` (EMA statistics, stored as buffers in the checkpoint)."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))
        self.register_buffer("centroids", torch.zeros(size, dim), persistent=False)

    def refresh(self) -> None:
        self.centroids = self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest centroid (Euclidean) for rows x [N, dim] → [N]. torch.cdist as the reference
        calls it: its matmul formulation decides near-ties, so the same call keeps the same codes."""
        return torch.cdist(x[None].float(), self.centroids[None].float(), p=2)[0].argmin(dim=-1)


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVectorQuantizer(nn.Module):
    """Codebooks applied in turn to what the previous ones left; 1×1 projections in and out when the
    quantizer is narrower than the model."""

    def __init__(self, cfg: MimiEncoderConfig, n_codebooks: int) -> None:
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(VectorQuantizer(cfg.codebook_size, cfg.codebook_dim) for _ in range(n_codebooks))
        self.input_proj: nn.Conv1d | None = None
        self.output_proj: nn.Conv1d | None = None
        if dim != cfg.hidden_size:
            self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
            self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)  # decode side: loaded, unused

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [B, hidden, T] → codes [n, B, T] from the first n codebooks."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        b, dim, t = x.shape
        residual = x.transpose(1, 2).reshape(b * t, dim)
        codes = []
        for vq in self.layers[:n]:
            idx = vq.codebook.nearest(residual)
            residual = residual - vq.codebook.centroids[idx]
            codes.append(idx.view(b, t))
        return torch.stack(codes)


class SplitResidualVectorQuantizer(nn.Module):
    """The semantic RVQ and the acoustic RVQ, each quantizing the same embedding."""

    def __init__(self, cfg: MimiEncoderConfig, n_codebooks: int) -> None:
        super().__init__()
        self.n_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, self.n_semantic)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, n_codebooks - self.n_semantic)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [B, hidden, T] → codes [B, n, T]."""
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = torch.cat([codes, rest])
        return codes.transpose(0, 1)


class MimiEncoder(nn.Module):
    """Waveform → codec frames. `n_codebooks` codebooks are built (default: all in the config); a loader
    builds only the `valid` ones it uses and skips the rest of the file's (see `unused_prefixes`)."""

    def __init__(self, cfg: MimiEncoderConfig, valid: int = 16, n_codebooks: int | None = None) -> None:
        super().__init__()
        self.cfg, self.valid = cfg, valid
        self.n_codebooks = n_codebooks if n_codebooks is not None else cfg.num_quantizers
        if not valid <= self.n_codebooks <= cfg.num_quantizers:
            raise ValueError(f"need {valid} <= n_codebooks {self.n_codebooks} <= {cfg.num_quantizers}")
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = MimiTransformer(cfg)
        # Replicate padding here, whatever `pad_mode` says: MimiModel builds its downsampling layer so.
        self.downsample = MimiConv(cfg.hidden_size, cfg.hidden_size, cfg.downsample_kernel, stride=2, bias=False,
                                   pad_mode="replicate")
        self.quantizer = SplitResidualVectorQuantizer(cfg, self.n_codebooks)
        self.samples_per_frame = cfg.conv_hop * 2

    def unused_prefixes(self, prefix: str) -> tuple[str, ...]:
        """Checkpoint prefixes of the acoustic codebooks this module did not build."""
        first = self.n_codebooks - self.cfg.num_semantic_quantizers
        last = self.cfg.num_quantizers - self.cfg.num_semantic_quantizers
        return tuple(f"{prefix}quantizer.acoustic_residual_vector_quantizer.layers.{i}." for i in range(first, last))

    def refresh(self) -> None:
        """Recompute centroids and RoPE frequencies (after loading weights, or building on meta)."""
        for m in self.modules():
            if isinstance(m, Codebook):
                m.refresh()
        t = self.encoder_transformer
        t.inv_freq = rope_inv_freq(self.cfg.attention_head_dim, t.rope_theta).to(self.downsample.conv.weight.device)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, 1, samples] → codes [B, valid, ceil(samples / samples_per_frame)]."""
        h = self.encoder(wav)
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        return self.quantizer.encode(self.downsample(h), self.valid)

    @torch.no_grad()
    def encode(self, wav: np.ndarray | torch.Tensor) -> torch.Tensor:
        """A mono 24 kHz waveform [samples] → codes [frames, valid] (int64), frames = ceil(samples / 1920)."""
        w = torch.as_tensor(np.asarray(wav, dtype=np.float32), device=self.downsample.conv.weight.device)
        if w.ndim != 1 or w.shape[0] == 0:
            raise ValueError(f"reference audio must be mono and non-empty [samples], got {tuple(w.shape)}")
        codes = self(w[None, None].to(self.downsample.conv.weight.dtype))[0]
        # The reference trims to ceil(samples / 1920); the causal padding already gives exactly that many.
        return codes[:, : -(-w.shape[0] // self.samples_per_frame)].T.contiguous()


def resample_to_24k(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 audio at `sample_rate` → 24 kHz, as the official wrapper does it (librosa.resample's
    default: soxr HQ, then zero-pad or trim to ceil(n · 24000 / sample_rate) samples)."""
    audio = np.asarray(wav, dtype=np.float32)
    if sample_rate == SAMPLE_RATE:
        return audio
    out = resample(audio, sample_rate, SAMPLE_RATE)
    n = int(np.ceil(audio.shape[0] * (SAMPLE_RATE / sample_rate)))
    return out[:n] if out.shape[0] >= n else np.pad(out, (0, n - out.shape[0]))


def load_encoder(codec_cfg: SpeechTokenizerConfig, tensors: dict[str, torch.Tensor], source: str,
                 device: str | torch.device = "cpu") -> MimiEncoder:
    """The `encoder.*` tensors of `speech_tokenizer/model.safetensors` as a MimiEncoder (fp32), strictly:
    every tensor it builds must be there, and only the unused codebooks past `encoder_valid_num_quantizers`
    may be left over."""
    valid = codec_cfg.encoder_valid_num_quantizers
    with torch.device("meta"):  # every tensor comes from the file
        encoder = MimiEncoder(codec_cfg.encoder(), valid, n_codebooks=valid)
    load_module(encoder, tensors, "encoder.", exclude=encoder.unused_prefixes("encoder."), dtype=torch.float32,
                source=source)
    encoder.refresh()
    return encoder.to(device).eval().requires_grad_(False)
