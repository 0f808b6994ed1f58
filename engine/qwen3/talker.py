"""The talker: a Qwen3 decoder that reads summed text+codec rows and predicts codebook 0 of each frame.

Parameter names follow the checkpoint under the `talker.` prefix (`model.layers.N…`, `model.codec_embedding`,
`model.text_embedding`, `text_projection.linear_fc{1,2}`, `codec_head`). The code predictor, stored under
`talker.code_predictor.`, is its own module (code_predictor.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.qwen3.config import TalkerConfig
from engine.qwen3.layers import DecoderStack, KVCache


class TalkerBackbone(DecoderStack):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TextProjection(nn.Module):
    """text_hidden → text_hidden → talker hidden, with bias and SiLU."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def text_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Text-track rows: text_projection(text_embedding(ids)), ids [...] → [..., hidden]."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        return self.model.new_cache(slots, max_len)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                kv_len: int | None = None) -> torch.Tensor:
        """Rows [B, T, H] at positions [B, T] into cache slots [B] → final-normed hidden [B, T, H]."""
        return self.model(embeds, positions, slots, cache, kv_len)

    def prefill(self, embeds: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor, cache: KVCache
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts right-padded to [B, T] with true lengths [B] → (cb0 logits [B, V], last hidden [B, H]).

        Each row occupies positions 0..T-1 of its slot; rows past a prompt's length are padding whose
        cache entries get overwritten by that row's later steps before they could be attended.
        """
        b, t, _ = embeds.shape
        positions = torch.arange(t, device=embeds.device).expand(b, t)
        hidden = self.forward(embeds, positions, slots, cache, kv_len=t)
        last = hidden[torch.arange(b, device=embeds.device), lengths - 1]
        return self.codec_head(last).float(), last

    def step(self, embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cache: KVCache,
             kv_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One row per slot: embeds [B, H] at positions [B] → (cb0 logits [B, V], hidden [B, H])."""
        hidden = self.forward(embeds[:, None], positions[:, None], slots, cache, kv_len)[:, 0]
        return self.codec_head(hidden).float(), hidden
