"""The TalkerBackend seam (DESIGN §3; research/vllm_talker_backend.md §4.1): the talker's side of
generation — prefill a request into a slot, step a batch of slots one frame, complete frames with the
code predictor, abort a slot — and nothing else. Prompts, text tracks, codec, scheduling and the
protocol stay in the core, so a vLLM-based talker can replace `NativeTalker` on GPUs later.

All shapes are padded to a batch bucket (padding rows use the pool's scratch slot and greedy sampling,
so they draw no randomness) and attention reads a key length rounded up to `kv_block`, so the number
of distinct shapes is small and every one of them is run once by `warm_up`.

Sampling goes through `choose`, which gives exactly `engine.qwen3.sampling.choose`'s ids but finds the
k-th best logit with `topk` instead of a full sort: with 16 rows the sort took 3 ms of every one of the
16 draws per frame, a third of the core's time (topk: 0.3 ms). `choose_cb0` and `complete_frames`
mirror the model's methods of the same names around it (the model should offer that choice itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.qwen3 import sampling
from engine.qwen3.layers import KVCache
from engine.qwen3.model import Qwen3TTSModel, SamplingParams
from engine.slots import SlotPool

_PAD_PARAMS = SamplingParams(greedy=True, repetition_penalty=1.0, min_new_tokens=0)


def top_k_filter(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """`sampling.temperature_top_k_top_p` for top_p >= 1: scale by temperature [B], keep the top_k [B]
    best (<= 0: all; ties with the k-th kept), the rest -inf."""
    v = logits.shape[-1]
    x = logits / temperature[:, None].to(logits.dtype)
    k = torch.where(top_k > 0, top_k.clamp(max=v), torch.full_like(top_k, v))
    kth = torch.topk(x, int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
    return x.masked_fill(x < kth, sampling.NEG_INF)


def choose(logits: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Exactly `sampling.choose`: argmax for greedy rows [B], a filtered inverse-CDF sample for the rest."""
    best = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return best
    t = temperature.clamp(min=1e-5)
    if bool((top_p < 1.0).any()):
        filtered = sampling.temperature_top_k_top_p(logits, t, top_k, top_p)
    else:
        filtered = top_k_filter(logits, t, top_k)
    return torch.where(greedy, best, sampling.sample_from_logits(filtered, uniforms))


def _col(values: Sequence[float | int | bool], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype, device=device)


def choose_cb0(model: Qwen3TTSModel, logits: torch.Tensor, seen: torch.Tensor, n_generated: torch.Tensor,
               params: Sequence[SamplingParams]) -> torch.Tensor:
    """`Qwen3TTSModel.choose_cb0` with the faster `choose`: codebook 0 for rows [B]."""
    dev = logits.device
    x = sampling.repetition_penalty(logits, seen, _col([p.repetition_penalty for p in params], logits.dtype, dev))
    x = sampling.suppress(x, model.suppress_mask)
    x = sampling.forbid_eos(x, model.eos_id, n_generated < _col([p.min_new_tokens for p in params], torch.long, dev))
    greedy = _col([p.greedy for p in params], torch.bool, dev)
    u = sampling.draw_uniforms([None if p.greedy else p.generator for p in params], dev)
    return choose(x, greedy, _col([p.temperature for p in params], x.dtype, dev),
                  _col([p.top_k for p in params], torch.long, dev), _col([p.top_p for p in params], x.dtype, dev), u)


def complete_frames(model: Qwen3TTSModel, hidden: torch.Tensor, cb0: torch.Tensor, params: Sequence[SamplingParams],
                    cache: KVCache) -> torch.Tensor:
    """`Qwen3TTSModel.complete_frames` with the faster `choose` and a caller-owned predictor cache."""
    dev = hidden.device
    greedy = _col([p.greedy for p in params], torch.bool, dev)
    temp = _col([p.sub_temperature for p in params], torch.float32, dev)
    top_k = _col([p.sub_top_k for p in params], torch.long, dev)
    top_p = _col([p.sub_top_p for p in params], torch.float32, dev)
    gens = [None if p.greedy else p.generator for p in params]

    def pick(_codebook: int, logits: torch.Tensor) -> torch.Tensor:
        return choose(logits, greedy, temp, top_k, top_p, sampling.draw_uniforms(gens, dev))

    rest = model.predictor(hidden, model.talker.codec_rows(cb0), pick, cache)
    return torch.cat([cb0[:, None], rest], dim=1)


class TalkerBackend(Protocol):
    eos_id: int

    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int: ...

    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]: ...

    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor: ...

    def abort(self, slot: int) -> None: ...


class NativeTalker:
    """The in-process talker over `Qwen3TTSModel`'s primitives and a `SlotPool`."""

    def __init__(self, model: Qwen3TTSModel, pool: SlotPool, max_bucket: int, kv_block: int = 64) -> None:
        self.model, self.pool, self.kv_block = model, pool, kv_block
        self.eos_id = model.eos_id
        # The predictor's 16-position cache restarts every frame: one buffer for the largest batch.
        self.predictor_cache = model.predictor.new_cache(max_bucket)

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
        cb0 = choose_cb0(self.model, logits, p.seen[slot_t], p.n_generated[slot_t], [params])
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
        cb0 = choose_cb0(self.model, logits, seen, n_gen, all_params)[:n]
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
        frames = complete_frames(self.model, hidden, cb0, all_params, self.predictor_cache)[:n]
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
            complete_frames(self.model, x, torch.zeros(b, dtype=torch.long, device=dev), [_PAD_PARAMS] * b,
                            self.predictor_cache)
