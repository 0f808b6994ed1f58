"""Per-stream state, preallocated at start-up, in two owners' hands.

- `SlotPool` is the core's: which slot ids are free (the admission resource) and one exact streaming
  codec state per slot (conv histories, transposed-conv tails, the 72-frame attention window). The
  codec is the core's whichever talker runs.
- `TalkerSlots` is the native talker's (engine/qwen3/serving/talker_backend.py `NativeTalker`): one talker KV cache
  row per slot (all layers, `max_context` positions) plus one scratch row for padding, and the carry
  between steps (last hidden state, codebook 0, last frame, position, generated-id set for the
  repetition penalty). The core never reads it; another backend (vLLM) keeps its own instead.

Nothing is allocated per request or per step, so memory is known at start-up and a freed slot is
reused by the next request as is (positions mask stale cache entries; the codec state is zeroed when
the core acquires the slot, the talker carry when the backend prefills it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.qwen3.codec import CodecState
from engine.qwen3.layers import KVCache
from engine.qwen3.model import Qwen3TTSModel


def _check(max_slots: int, max_context: int) -> None:
    if max_slots < 1 or max_context < 8:
        raise ValueError(f"need max_streams >= 1 and max_context >= 8, got {max_slots}, {max_context}")


@dataclass
class SlotPool:
    """The core's side of the slots: free ids and the codec state of each."""

    max_streams: int
    codec: CodecState  # max_streams rows
    free: list[int]

    @classmethod
    def allocate(cls, model: Qwen3TTSModel, max_streams: int) -> SlotPool:
        _check(max_streams, 8)
        # Lowest slot first: a quiet engine keeps touching the same (cache-warm) rows.
        return cls(max_streams, model.codec.new_state(max_streams), list(range(max_streams - 1, -1, -1)))

    @property
    def available(self) -> int:
        return len(self.free)

    def acquire(self) -> int:
        slot = self.free.pop()
        self.codec.reset([slot])
        return slot

    def release(self, slot: int) -> None:
        if slot in self.free or not 0 <= slot < self.max_streams:
            raise ValueError(f"slot {slot} is not in use")
        self.free.append(slot)
        self.free.sort(reverse=True)

    def bytes_per_slot(self) -> dict[str, int]:
        return {"codec": self.codec.nbytes() // self.max_streams}


@dataclass
class TalkerSlots:
    """The native talker's side of the slots (see the module docstring)."""

    max_slots: int
    max_context: int
    kv: KVCache  # max_slots + 1 rows: the last one is scratch space for padding rows
    hidden: torch.Tensor  # [S, H] talker hidden state that produced `cb0`
    cb0: torch.Tensor  # [S] codebook 0 of the frame being completed
    last_frame: torch.Tensor  # [S, 16] the last completed frame (the next talker input)
    n_generated: torch.Tensor  # [S] codebook-0 ids accepted so far (min_new_tokens)
    prompt_len: torch.Tensor  # [S]
    seen: torch.Tensor  # [S, V] bool: generated codebook-0 ids (repetition penalty)

    @classmethod
    def allocate(cls, model: Qwen3TTSModel, max_slots: int, max_context: int) -> TalkerSlots:
        _check(max_slots, max_context)
        tc, dev = model.cfg.talker_config, model.device
        dtype = model.talker.codec_head.weight.dtype
        s = max_slots
        return cls(
            max_slots, max_context,
            kv=model.new_kv_cache(s + 1, max_context),
            hidden=torch.zeros(s, tc.hidden_size, dtype=dtype, device=dev),
            cb0=torch.zeros(s, dtype=torch.long, device=dev),
            last_frame=torch.zeros(s, 16, dtype=torch.long, device=dev),
            n_generated=torch.zeros(s, dtype=torch.long, device=dev),
            prompt_len=torch.zeros(s, dtype=torch.long, device=dev),
            seen=torch.zeros(s, tc.vocab_size, dtype=torch.bool, device=dev),
        )

    @property
    def scratch_slot(self) -> int:
        return self.max_slots

    def start(self, slot: int, prompt_len: int) -> None:
        """A fresh request in `slot`: the carry of its last occupant is forgotten."""
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.max_slots})")
        self.seen[slot] = False
        self.n_generated[slot] = 0
        self.prompt_len[slot] = prompt_len

    def bytes_per_slot(self) -> dict[str, int]:
        kv = (self.kv.k.numel() * self.kv.k.element_size() * 2) // (self.max_slots + 1)
        carry = sum(t[0].numel() * t.element_size() for t in
                    (self.hidden, self.cb0, self.last_frame, self.n_generated, self.prompt_len, self.seen))
        return {"kv": kv, "carry": carry}
