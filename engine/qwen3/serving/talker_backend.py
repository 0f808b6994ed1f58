"""The TalkerBackend seam (so a vLLM talker can stand in for the native one, the core unchanged): the talker's side of
generation — prefill a request into a slot, step a batch of slots one frame, complete frames with the
code predictor, abort a slot — and nothing else. Prompts, text tracks, the codec and its state,
scheduling and the protocol stay in the core (engine/qwen3/serving/core.py), which holds a `TalkerBackend` and never
touches talker tensors; `NativeTalker` (below) is the in-process one, a vLLM talker is another.

`NativeTalker`: all shapes are padded to a batch bucket (padding rows use its scratch slot and greedy
sampling, so they draw no randomness) and attention reads a key length rounded up to `kv_block`, so the
number of distinct shapes is small and every one of them is run once by `warm_up`. With `cuda_graphs`,
each call splits into a host part (slot gathers, `int(...)`, uniforms drawn from the rows' generators,
the sampler's path facts) and a tensor part run through `engine.qwen3.serving.graphs.StaticCall`: the talker step
keyed by (bucket, kv_len), the code-predictor pass by (bucket, sampler path). On CUDA those are
captured as CUDA graphs and replayed; elsewhere the same static-buffer path runs uncaptured.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from engine.qwen3 import generate
from engine.qwen3.generate import SamplingParams
from engine.qwen3.layers import KVCache
from engine.qwen3.model import Qwen3TTSModel
from engine.qwen3.sampling import RowSampler
from engine.qwen3.serving.graphs import StaticCall
from engine.qwen3.serving.slots import TalkerSlots

log = logging.getLogger("voxgate.engine.talker")

_PAD_PARAMS = SamplingParams(greedy=True, repetition_penalty=1.0, min_new_tokens=0)
# A RowSampler's tensors are static inputs of the captured code-predictor pass; its path facts are
# part of the graph key (each path is a different sequence of kernels).
_SAMPLER_TENSORS = ("greedy", "temperature", "top_k", "top_p")
_SAMPLER_FACTS = ("all_greedy", "any_greedy", "k", "any_top_p")


def _capturable(sampler: RowSampler) -> bool:
    """The full-vocabulary path (some sampled row keeps every id: k == 0) syncs with the host inside
    `sampling.temperature_top_k_top_p` (`int(k.max())`, `bool(...any())`), so it runs uncaptured."""
    return sampler.all_greedy or sampler.k > 0


@dataclass(frozen=True)
class TalkerSpec:
    """What the core asks of a talker it builds (`TalkerFactory`)."""

    max_slots: int  # slot ids 0..max_slots-1: streams the core admits at once
    max_context: int  # positions per slot: prompt rows + frames (the core never steps past it)
    buckets: tuple[int, ...]  # padded batch sizes of step/complete calls, increasing; warm_up gets them too
    kv_block: int = 64  # native: attention key lengths are rounded up to this
    cuda_graphs: bool = False  # native: capture the step and the predictor pass (engine/qwen3/serving/graphs.py)
    options: Mapping[str, Any] = field(default_factory=dict)  # backend-specific (e.g. vLLM's memory share)


@runtime_checkable
class TalkerBackend(Protocol):
    """The talker behind the core: prefill a request into a slot, step a batch of slots one frame,
    complete frames with the code predictor, abort a slot. Every method is called from the core's one
    thread, one call at a time; `warm_up` once before the first `prefill`; `close` once, last. The
    backend owns each slot's talker state (allocated in `prefill`, freed in `abort`); the core owns the
    slot ids and their codec state and never touches a talker tensor. What the core guarantees (call
    order per slot, one prefill/step/complete per cycle, batches of distinct slots in a bucket, parked
    slots keep their state) and what it expects back (ints in slot order, frames the caller owns, rows
    independent of each other, a failed call leaves every slot as before): docs/engine.md "The talker
    contract"; tests/support/talker_conformance.py checks it."""

    eos_id: int
    max_slots: int
    max_context: int

    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int:
        """Start a request in free `slot` from its prompt rows [T, H] → codebook 0 of frame 0 (EOS possible)."""
        ...

    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]:
        """One talker step for each slot (its last frame completed) → the next codebook-0 id per slot."""
        ...

    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor:
        """The code predictor for each slot's pending codebook 0 → frames [len(slots), 16]."""
        ...

    def abort(self, slot: int) -> None:
        """End the request in `slot` (any reason) and free its state now; the slot is free again."""
        ...

    def warm_up(self, buckets: Sequence[int]) -> dict[int, float]:
        """Run every shape once; → bucket → seconds of one warm step + complete (see the class docstring)."""
        ...

    def slot_bytes(self) -> dict[str, int]:
        """Bytes the backend holds per slot, by part (start-up log, memory reports)."""
        ...

    def close(self) -> None:
        """Free everything (the core is stopping); no call follows."""
        ...


#: Builds a backend on the core's thread (its torch work belongs there), before the first cycle.
TalkerFactory = Callable[[Qwen3TTSModel, TalkerSpec], TalkerBackend]

#: Talkers by name (`load_engine(..., talker=NAME)`): "module:attribute" of a `TalkerFactory`, imported
#: only when named, so the default install never imports another engine's packages.
TALKERS: dict[str, str] = {
    "native": "engine.qwen3.serving.talker_backend:NativeTalker.create",
    "vllm": "engine.vllm_talker.talker:VllmTalker.create",  # needs vLLM installed (docs/vllm.md)
}


def talker_factory(talker: str | TalkerFactory) -> TalkerFactory:
    """A factory, or the registered one named `talker` (ValueError naming the known ones)."""
    if callable(talker):
        return talker
    target = TALKERS.get(str(talker).strip().lower())
    if target is None:
        raise ValueError(f"no talker {talker!r}; known: {sorted(TALKERS)}")
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


class NativeTalker:
    """The in-process talker over `Qwen3TTSModel`'s primitives and its own `TalkerSlots`."""

    def __init__(self, model: Qwen3TTSModel, max_slots: int, max_context: int, kv_block: int = 64,
                 cuda_graphs: bool = False) -> None:
        self.model, self.kv_block = model, kv_block
        self.pool = TalkerSlots.allocate(model, max_slots, max_context)
        self.eos_id = model.eos_id
        self.max_slots, self.max_context = max_slots, max_context
        dev = self.pool.hidden.device
        capture = cuda_graphs and dev.type == "cuda" and torch.cuda.is_available()
        if cuda_graphs and not capture:
            log.warning("cuda_graphs: the model is on %s, not a CUDA device; the talker step and code "
                        "predictor run on static buffers without capture", dev)
        self.cuda_graphs, self.capture = cuda_graphs, capture
        self._step_call = StaticCall(self._step_tensors, dev, capture) if cuda_graphs else None
        self._predict_call = StaticCall(self._predict_tensors, dev, capture) if cuda_graphs else None
        self._predictor_caches: dict[int, KVCache] = {}

    @classmethod
    def create(cls, model: Qwen3TTSModel, spec: TalkerSpec) -> NativeTalker:
        """The `TalkerFactory` the core uses by default."""
        return cls(model, spec.max_slots, spec.max_context, spec.kv_block, spec.cuda_graphs)

    def _kv_len(self, max_position: int) -> int:
        blocks = -(-(max_position + 1) // self.kv_block)
        return min(blocks * self.kv_block, self.pool.max_context)

    def _predictor_cache(self, rows: int) -> KVCache:
        # One per batch size, allocated once: a captured graph keeps writing to the cache it was
        # captured with, so a cache must never be replaced by a larger one.
        cache = self._predictor_caches.get(rows)
        if cache is None:
            cache = self._predictor_caches[rows] = self.model.predictor.new_cache(rows)
        return cache

    @torch.no_grad()
    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int:
        """Prompt rows [T, H] into `slot` → the first codebook-0 id (EOS possible)."""
        p = self.pool
        t = rows.shape[0]
        if t >= p.max_context:
            raise ValueError(f"prompt of {t} rows does not fit max_context {p.max_context}")
        p.start(slot, t)
        slot_t = torch.tensor([slot], device=p.hidden.device)
        logits, hidden = self.model.talker.prefill(rows[None], torch.tensor([t], device=rows.device), slot_t, p.kv)
        cb0 = generate.choose_cb0(self.model, logits, p.seen[slot_t], p.n_generated[slot_t], [params])
        p.hidden[slot], p.cb0[slot] = hidden[0], cb0[0]
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

    def _step_tensors(self, kv_len: int, frames: torch.Tensor, text_rows: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker step's tensor part: last frames [B, 16] + text rows [B, H] at positions [B] of cache
        slots [B] → (codebook-0 logits [B, V], hidden [B, H])."""
        x = generate.next_inputs(self.model, frames, text_rows)
        return self.model.talker.step(x, positions, slots, self.pool.kv, kv_len=kv_len)

    def _run_step(self, kv_len: int, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._step_call is not None:
            return self._step_call(kv_len, *inputs)
        return self._step_tensors(kv_len, *inputs)

    def _predict_tensors(self, facts: tuple[tuple[str, object], ...], hidden: torch.Tensor, cb0: torch.Tensor,
                         u: torch.Tensor, *sampler_tensors: torch.Tensor) -> tuple[torch.Tensor]:
        """The code-predictor pass's tensor part: the sampler is rebuilt from static tensors and path facts."""
        sampler = RowSampler(**dict(zip(_SAMPLER_TENSORS, sampler_tensors, strict=True)), **dict(facts))
        return (generate.predict_frames(self.model, hidden, cb0, sampler, u, self._predictor_cache(hidden.shape[0])),)

    def _run_predict(self, hidden: torch.Tensor, cb0: torch.Tensor, params: Sequence[SamplingParams]
                     ) -> torch.Tensor:
        """Frames [B, 16] for rows [B]; with cuda_graphs a static output: valid until the next pass."""
        sampler, u = generate.predictor_sampler(self.model, params, hidden.device)  # host: generators, path facts
        cache = self._predictor_cache(hidden.shape[0])  # allocated here, never inside a capture
        if self._predict_call is not None and _capturable(sampler):
            facts = tuple((f, getattr(sampler, f)) for f in _SAMPLER_FACTS)
            tensors = [getattr(sampler, f) for f in _SAMPLER_TENSORS]
            return self._predict_call(facts, hidden, cb0, u, *tensors)[0]
        return generate.predict_frames(self.model, hidden, cb0, sampler, u, cache)

    @torch.no_grad()
    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]:
        """One talker step for `slots` (each has a completed last frame): input = Σ codes of that frame +
        its text-track row [B, H] → the next codebook-0 id per slot (EOS ends a request)."""
        p, n = self.pool, len(slots)
        dev = p.hidden.device
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=dev)
        frames, pos = p.last_frame[idx], self.positions(slots)
        kv_len = self._kv_len(int(pos.max()))  # a host sync: before any captured work
        pad = bucket - n
        all_slots, all_params = idx, list(params)
        if pad > 0:
            all_slots = torch.cat([idx, torch.full((pad,), p.scratch_slot, device=dev)])
            pos = torch.cat([pos, torch.zeros(pad, dtype=torch.long, device=dev)])
            frames = torch.cat([frames, frames.new_zeros(pad, frames.shape[1])])
            text_rows = torch.cat([text_rows, text_rows.new_zeros(pad, text_rows.shape[1])])
            all_params += [_PAD_PARAMS] * pad
        logits, hidden = self._run_step(kv_len, frames, text_rows, pos, all_slots)
        seen = torch.cat([p.seen[idx], p.seen.new_zeros(pad, p.seen.shape[1])]) if pad > 0 else p.seen[idx]
        n_gen = torch.cat([p.n_generated[idx], p.n_generated.new_ones(pad)]) if pad > 0 else p.n_generated[idx]
        cb0 = generate.choose_cb0(self.model, logits, seen, n_gen, all_params)[:n]
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
        frames = self._run_predict(hidden, cb0, all_params)[:n]
        if self._predict_call is not None:
            frames = frames.clone()  # the caller keeps these rows; the static output is reused next pass
        p.last_frame[idx] = frames
        return frames

    def abort(self, slot: int) -> None:
        """Nothing to free: the slot's cache rows are masked by position for its next occupant, and its
        carry is reset by the next `prefill`."""
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.max_slots})")

    def slot_bytes(self) -> dict[str, int]:
        return self.pool.bytes_per_slot()

    def close(self) -> None:
        """Nothing held beyond memory the garbage collector frees with the talker."""

    @torch.no_grad()
    def warm_up(self, buckets: Sequence[int]) -> dict[int, float]:
        """Run every batch bucket once on the scratch slot (CPU kernels pay on a shape's first run). With
        cuda_graphs, run every static shape the engine will use — every (bucket, kv_len), and the code
        predictor's greedy and default sampled paths — so graphs are captured before the first stream.
        Returns what one warm step (a second run of the talker step and the predictor) cost per bucket:
        the throughput meter's prior for batches not measured yet."""
        p = self.pool
        dev = p.hidden.device
        h = self.model.talker.cfg.hidden_size
        last = self._kv_len(p.max_context - 1)
        if self.cuda_graphs:
            kv_lens = sorted({self._kv_len(pos) for pos in range(0, p.max_context, self.kv_block)} | {last})
        else:
            kv_lens = sorted({self._kv_len(0), last})
        sampled = SamplingParams.from_defaults(self.model.gen, seed=0)
        costs: dict[int, float] = {}
        for b in buckets:
            x = torch.zeros(b, h, dtype=p.hidden.dtype, device=dev)
            frames = torch.zeros(b, p.last_frame.shape[1], dtype=torch.long, device=dev)
            pos = torch.zeros(b, dtype=torch.long, device=dev)
            slots = torch.full((b,), p.scratch_slot, device=dev)
            for kv_len in kv_lens:
                self._run_step(kv_len, frames, x, pos, slots)
            # Also allocates this bucket's predictor cache now, not mid-stream.
            self._run_predict(x, pos, [_PAD_PARAMS] * b)
            if self.cuda_graphs and not sampled.greedy:
                self._run_predict(x, pos, [sampled] * b)
                if b > 1:  # one stream padded with greedy rows: another path
                    self._run_predict(x, pos, [sampled] + [_PAD_PARAMS] * (b - 1))
            costs[b] = self._timed_step(kv_lens[0], frames, x, pos, slots, b)
        return costs

    def _timed_step(self, kv_len: int, frames: torch.Tensor, x: torch.Tensor, pos: torch.Tensor,
                    slots: torch.Tensor, rows: int) -> float:
        """Seconds of one warm talker step and predictor run at `rows` (the shapes already ran once)."""
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        self._run_step(kv_len, frames, x, pos, slots)
        self._run_predict(x, pos, [_PAD_PARAMS] * rows)
        sync()
        return time.perf_counter() - t0
