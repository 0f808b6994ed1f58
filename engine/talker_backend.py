"""The TalkerBackend seam (DESIGN §3; research/vllm_talker_backend.md §4.1): the talker's side of
generation — prefill a request into a slot, step a batch of slots one frame, complete frames with the
code predictor, abort a slot — and nothing else. Prompts, text tracks, codec, scheduling and the
protocol stay in the core, so a vLLM-based talker can replace `NativeTalker` on GPUs later.

All shapes are padded to a batch bucket (padding rows use the pool's scratch slot and greedy sampling,
so they draw no randomness) and attention reads a key length rounded up to `kv_block`, so the number
of distinct shapes is small and every one of them is run once by `warm_up`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.qwen3.model import Qwen3TTSModel, SamplingParams
from engine.slots import SlotPool

_PAD_PARAMS = SamplingParams(greedy=True, repetition_penalty=1.0, min_new_tokens=0)


class TalkerBackend(Protocol):
    eos_id: int

    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int: ...

    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]: ...

    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor: ...

    def abort(self, slot: int) -> None: ...


class NativeTalker:
    """The in-process talker over `Qwen3TTSModel`'s primitives and a `SlotPool`."""

    def __init__(self, model: Qwen3TTSModel, pool: SlotPool, kv_block: int = 64) -> None:
        self.model, self.pool, self.kv_block = model, pool, kv_block
        self.eos_id = model.eos_id

    def _kv_len(self, max_position: int) -> int:
        blocks = -(-(max_position + 1) // self.kv_block)
        return min(blocks * self.kv_block, self.pool.max_context)

    @torch.no_grad()
    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int:
        """Prompt rows [T, H] into `slot` → the first codebook-0 id (EOS possible)."""
        p = self.pool
        t = rows.shape[0]
        if t >= p.max_context:
            raise ValueError(f"prompt of {t} rows does not fit max_context {p.max_context}")
        slot_t = torch.tensor([slot], device=p.hidden.device)
        logits, hidden = self.model.talker.prefill(rows[None], torch.tensor([t], device=rows.device), slot_t, p.kv)
        cb0 = self.model.choose_cb0(logits, p.seen[slot_t], p.n_generated[slot_t], [params])
        p.hidden[slot], p.cb0[slot], p.prompt_len[slot] = hidden[0], cb0[0], t
        return self._accept(slot, int(cb0[0]))

    def _accept(self, slot: int, cb0: int) -> int:
        if cb0 != self.eos_id:
            self.pool.seen[slot, cb0] = True
            self.pool.n_generated[slot] += 1
        return cb0

    def positions(self, slots: Sequence[int]) -> torch.Tensor:
        """Where each slot's next talker input goes: after the prompt and one row per accepted frame."""
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=self.pool.hidden.device)
        return self.pool.prompt_len[idx] + self.pool.n_generated[idx] - 1

    @torch.no_grad()
    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]:
        """One talker step for `slots` (each has a completed last frame): input = Σ codes of that frame +
        its text-track row [B, H] → the next codebook-0 id per slot (EOS ends a request)."""
        p, n = self.pool, len(slots)
        dev = p.hidden.device
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=dev)
        x = self.model.next_inputs(p.last_frame[idx], text_rows)
        pos = self.positions(slots)
        pad = bucket - n
        all_slots, all_pos, all_params = idx, pos, list(params)
        if pad > 0:
            all_slots = torch.cat([idx, torch.full((pad,), p.scratch_slot, device=dev)])
            all_pos = torch.cat([pos, torch.zeros(pad, dtype=torch.long, device=dev)])
            x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
            all_params += [_PAD_PARAMS] * pad
        logits, hidden = self.model.talker.step(x, all_pos, all_slots, p.kv, kv_len=self._kv_len(int(pos.max())))
        seen = torch.cat([p.seen[idx], p.seen.new_zeros(pad, p.seen.shape[1])]) if pad > 0 else p.seen[idx]
        n_gen = torch.cat([p.n_generated[idx], p.n_generated.new_ones(pad)]) if pad > 0 else p.n_generated[idx]
        cb0 = self.model.choose_cb0(logits, seen, n_gen, all_params)[:n]
        p.hidden[idx] = hidden[:n]
        p.cb0[idx] = cb0
        return [self._accept(s, int(c)) for s, c in zip(slots, cb0.tolist(), strict=True)]

    @torch.no_grad()
    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor:
        """One batched code-predictor pass: the frames [B, 16] whose codebook 0 the slots hold."""
        p, n = self.pool, len(slots)
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=p.hidden.device)
        hidden, cb0, all_params = p.hidden[idx], p.cb0[idx], list(params)
        if bucket > n:
            hidden = torch.cat([hidden, hidden.new_zeros(bucket - n, hidden.shape[1])])
            cb0 = torch.cat([cb0, cb0.new_zeros(bucket - n)])
            all_params += [_PAD_PARAMS] * (bucket - n)
        frames = self.model.complete_frames(hidden, cb0, all_params)[:n]
        p.last_frame[idx] = frames
        return frames

    def abort(self, slot: int) -> None:
        """Nothing to undo: the slot's cache rows are masked by position for its next occupant."""

    @torch.no_grad()
    def warm_up(self, buckets: Sequence[int]) -> None:
        """Run every batch bucket once on the scratch slot (CPU kernels pay on a shape's first run)."""
        p = self.pool
        dev = p.hidden.device
        h = self.model.talker.cfg.hidden_size
        for b in buckets:
            x = torch.zeros(b, h, dtype=p.hidden.dtype, device=dev)
            slots = torch.full((b,), p.scratch_slot, device=dev)
            for kv_len in sorted({self._kv_len(0), self._kv_len(p.max_context - 1)}):
                self.model.talker.step(x, torch.zeros(b, dtype=torch.long, device=dev), slots, p.kv, kv_len=kv_len)
            # Also sizes the model's predictor cache for the largest bucket now, not mid-stream.
            self.model.complete_frames(x, torch.zeros(b, dtype=torch.long, device=dev), [_PAD_PARAMS] * b)
