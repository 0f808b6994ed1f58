"""The slot pool: every piece of per-stream state the engine core needs, preallocated at start-up.

A slot is one talker KV cache row (all layers, `max_context` positions), the talker-side carry between
steps (last hidden state, codebook 0, last frame, position, generated-id set for the repetition penalty)
and one exact streaming codec state. Nothing is allocated per request or per step, so memory is known
at start-up and a freed slot is reused by the next request as is (positions mask stale cache entries;
the codec state is zeroed on allocation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.qwen3.codec import CodecState
from engine.qwen3.layers import KVCache
from engine.qwen3.model import Qwen3TTSModel


@dataclass
class SlotPool:
    max_streams: int
    max_context: int
    kv: KVCache  # max_streams + 1 rows: the last one is scratch space for padding rows
    codec: CodecState  # max_streams rows
    hidden: torch.Tensor  # [S, H] talker hidden state that produced `cb0`
    cb0: torch.Tensor  # [S] codebook 0 of the frame being completed
    last_frame: torch.Tensor  # [S, 16] the last completed frame (the next talker input)
    n_generated: torch.Tensor  # [S] codebook-0 ids accepted so far (min_new_tokens)
    prompt_len: torch.Tensor  # [S]
    seen: torch.Tensor  # [S, V] bool: generated codebook-0 ids (repetition penalty)
    free: list[int]

    @classmethod
    def allocate(cls, model: Qwen3TTSModel, max_streams: int, max_context: int) -> SlotPool:
        if max_streams < 1 or max_context < 8:
            raise ValueError(f"need max_streams >= 1 and max_context >= 8, got {max_streams}, {max_context}")
        tc, dev = model.cfg.talker_config, model.device
        dtype = model.talker.codec_head.weight.dtype
        s = max_streams
        return cls(
            max_streams, max_context,
            kv=model.new_kv_cache(s + 1, max_context),
            codec=model.codec.new_state(s),
            hidden=torch.zeros(s, tc.hidden_size, dtype=dtype, device=dev),
            cb0=torch.zeros(s, dtype=torch.long, device=dev),
            last_frame=torch.zeros(s, 16, dtype=torch.long, device=dev),
            n_generated=torch.zeros(s, dtype=torch.long, device=dev),
            prompt_len=torch.zeros(s, dtype=torch.long, device=dev),
            seen=torch.zeros(s, tc.vocab_size, dtype=torch.bool, device=dev),
            # Lowest slot first: a quiet engine keeps touching the same (cache-warm) rows.
            free=list(range(s - 1, -1, -1)),
        )

    @property
    def scratch_slot(self) -> int:
        return self.max_streams

    @property
    def available(self) -> int:
        return len(self.free)

    def acquire(self) -> int:
        slot = self.free.pop()
        self.codec.reset([slot])
        self.seen[slot] = False
        self.n_generated[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self.free or not 0 <= slot < self.max_streams:
            raise ValueError(f"slot {slot} is not in use")
        self.free.append(slot)
        self.free.sort(reverse=True)

    def bytes_per_slot(self) -> dict[str, int]:
        """Bytes each slot holds, by part (the start-up log reports these)."""
        kv = (self.kv.k.numel() * self.kv.k.element_size() * 2) // (self.max_streams + 1)
        carry = sum(t[0].numel() * t.element_size() for t in
                    (self.hidden, self.cb0, self.last_frame, self.n_generated, self.prompt_len, self.seen))
        return {"kv": kv, "codec": self.codec.nbytes() // self.max_streams, "carry": carry}
