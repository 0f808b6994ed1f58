"""The code predictor: completes a frame's codebooks 1..15 from the talker's hidden state and codebook 0.

Per frame it runs a 2-row prefill `[talker_hidden, codec_embedding(cb0)]`, then 14 one-row steps, each
feeding the code it just chose; the KV cache holds at most 16 positions and starts over every frame, so
it is one small fixed buffer for the whole batch. Parameter names follow `talker.code_predictor.*`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.qwen3.config import CodePredictorConfig
from engine.qwen3.layers import DecoderStack, KVCache

#: (codebook index 1..15, logits [B, vocab]) -> codes [B]
CodePicker = Callable[[int, torch.Tensor], torch.Tensor]


class PredictorBackbone(DecoderStack):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta)
        # Sized to the talker: the same tables embed codebooks 1..15 into the talker's next input row.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = PredictorBackbone(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True) if talker_hidden != cfg.hidden_size
            else nn.Identity()
        )

    @property
    def steps(self) -> int:
        return self.cfg.num_code_groups - 1

    def new_cache(self, max_batch: int) -> KVCache:
        return self.model.new_cache(max_batch, self.cfg.num_code_groups)

    def embed_codes(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """Talker-width embeddings of codebooks 1..15: codes [..., 15] → 15 × [..., talker_hidden]."""
        return [emb(codes[..., i]) for i, emb in enumerate(self.model.codec_embedding)]

    def forward(self, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor, pick: CodePicker,
                cache: KVCache) -> torch.Tensor:
        """talker_hidden [B, Ht] and codec_embedding(cb0) [B, Ht] → codebooks 1..15 as [B, 15].

        `pick` chooses each codebook from its logits (argmax or a sampler with per-row generators);
        rows never interact, so a row's codes do not depend on the batch it runs in.
        """
        b = talker_hidden.shape[0]
        if b > cache.slots:
            raise ValueError(f"code predictor cache holds {cache.slots} rows, got {b}")
        dev = talker_hidden.device
        slots = torch.arange(b, device=dev)
        x = self.small_to_mtp_projection(torch.stack((talker_hidden, cb0_embed), dim=1))
        positions = torch.arange(2, device=dev).expand(b, 2)
        h = self.model(x, positions, slots, cache, kv_len=2)[:, -1]
        codes = []
        for j in range(self.steps):
            code = pick(j + 1, self.lm_head[j](h).float())
            codes.append(code)
            if j + 1 == self.steps:
                break
            x = self.small_to_mtp_projection(self.model.codec_embedding[j](code))[:, None]
            pos = torch.full((b, 1), j + 2, device=dev, dtype=torch.long)
            h = self.model(x, pos, slots, cache, kv_len=j + 3)[:, 0]
        return torch.stack(codes, dim=1)
