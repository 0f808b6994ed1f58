"""Checks every `TalkerBackend` (engine/qwen3/serving/talker_backend.py) must pass, whatever engine runs the talker.

Each check takes `make(spec) -> TalkerBackend` and the loaded model, and drives the backend the way
the core does (one prefill a cycle, then one step, then one complete over every slot that produced
codebook 0; slots not contiguous, batch order changing, some slots sitting out cycles) — no core, no
codec, so a failure names the backend. Greedy codes are compared with `Qwen3TTSModel.generate_batch`,
the model's reference loop. Used by tests/engine/test_talker_conformance.py for the native talker;
another backend's tier calls the same checks with its own `make` (`ALL_CHECKS`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.qwen3 import generate
from engine.qwen3.generate import GenerationRequest, SamplingParams
from engine.qwen3.model import Qwen3TTSModel
from engine.qwen3.prompt import Prompt
from engine.qwen3.serving.talker_backend import TalkerBackend, TalkerSpec

Make = Callable[[TalkerSpec], TalkerBackend]
SPEC = TalkerSpec(max_slots=6, max_context=128, buckets=(4, 8), kv_block=32)
TEXTS = ("Hello there, this is a test.", "Streaming text in, audio out.", "A third voice joins the batch.",
         "And one more for good measure.")
FRAMES = 8  # frames per request: long enough to interleave, short enough for CI


@dataclass
class Run:
    """One request the driver speaks: its prompt, params and what came back."""

    slot: int
    prompt: Prompt
    params: SamplingParams
    max_frames: int = FRAMES
    frames: list[np.ndarray] = field(default_factory=list)
    pending: bool = False  # codebook 0 produced, frame not completed yet
    done: bool = False

    def text_row(self) -> torch.Tensor:
        g = len(self.frames) - 1  # the step making frame g+1 consumes trailing row g
        trailing = self.prompt.trailing
        return trailing[g] if g < trailing.shape[0] else self.prompt.pad

    def codes(self) -> np.ndarray:
        return np.stack(self.frames) if self.frames else np.zeros((0, 16), np.int64)


def _bucket(spec: TalkerSpec, rows: int) -> int:
    return next(b for b in spec.buckets if b >= rows)


def drive(backend: TalkerBackend, spec: TalkerSpec, runs: Sequence[Run], start: Sequence[int] | None = None,
          sit_out: Callable[[int, Run], bool] = lambda cycle, run: False, order: int = 1) -> None:
    """Speak `runs` to their end (EOS or `max_frames`) as the core would: run i is prefilled at cycle
    `start[i]` (default i: one prefill a cycle); `sit_out(cycle, run)` leaves a live run out of that
    cycle's step (parked or paused); `order` -1 steps the batch in reverse order every other cycle."""
    start = list(range(len(runs))) if start is None else list(start)
    eos = backend.eos_id
    cycle = 0
    while not all(r.done for r in runs):
        assert cycle < 10_000, "the driver did not finish"
        produced: list[Run] = []
        waiting = [r for i, r in enumerate(runs) if start[i] <= cycle and not r.done and not r.frames
                   and not r.pending]
        if waiting:
            r = waiting[0]
            cb0 = backend.prefill(r.slot, r.prompt.rows, r.params)
            assert isinstance(cb0, int)
            if cb0 == eos or r.max_frames == 0:
                r.done = True
                backend.abort(r.slot)
            else:
                r.pending = True
                produced.append(r)
        stepping = [r for r in runs if r.frames and not r.pending and not r.done and not sit_out(cycle, r)]
        if order < 0 and cycle % 2:
            stepping.reverse()
        if stepping:
            rows = torch.stack([r.text_row() for r in stepping])
            ids = backend.step([r.slot for r in stepping], rows, [r.params for r in stepping],
                               _bucket(spec, len(stepping)))
            assert len(ids) == len(stepping) and all(isinstance(i, int) for i in ids)
            for r, cb0 in zip(stepping, ids, strict=True):
                if cb0 == eos:
                    r.done = True
                    backend.abort(r.slot)
                else:
                    r.pending = True
                    produced.append(r)
        if produced:
            frames = backend.complete([r.slot for r in produced], [r.params for r in produced],
                                      _bucket(spec, len(produced)))
            assert tuple(frames.shape) == (len(produced), 16) and frames.dtype == torch.long
            for r, frame in zip(produced, frames, strict=True):
                assert int(frame[0]) != eos
                r.frames.append(frame.cpu().numpy().copy())
                r.pending = False
                if len(r.frames) >= r.max_frames:
                    r.done = True
                    backend.abort(r.slot)
        cycle += 1


def _prompt(model: Qwen3TTSModel, i: int) -> Prompt:
    return model.build_prompt(TEXTS[i % len(TEXTS)], voice=model.speakers[0], language="english")


def _greedy() -> SamplingParams:
    return SamplingParams(greedy=True, repetition_penalty=1.05)


def _reference(model: Qwen3TTSModel, prompt: Prompt, max_frames: int = FRAMES) -> np.ndarray:
    # The same greedy params as the backend's run: the reference loop applies penalty and suppression too.
    return generate.generate_batch(model, [GenerationRequest(prompt, _greedy(), max_frames)])[0]


def _new(make: Make, spec: TalkerSpec = SPEC) -> TalkerBackend:
    backend = make(spec)
    backend.warm_up(spec.buckets)
    return backend


# ---- the core's side of the contract ----------------------------------------------------------------------
class CheckedTalker:
    """Wraps a backend and checks, on every call, the guarantees `TalkerBackend` says the core keeps
    (per-slot call order, one thread, distinct slots in a warmed bucket, text rows per slot, one params
    object per request, prompts and positions inside `max_context`). A broken guarantee is recorded in
    `violations` and raised. Run the engine with `talker=CheckedTalker.around(factory)`."""

    def __init__(self, inner: TalkerBackend, spec: TalkerSpec) -> None:
        self.inner, self.spec = inner, spec
        self.eos_id, self.max_slots, self.max_context = inner.eos_id, inner.max_slots, inner.max_context
        self.state: dict[int, str] = {}  # live slot → "pending" (owes a complete) | "ready" | "eos"
        self.params: dict[int, SamplingParams] = {}
        self.steps: dict[int, int] = {}  # live slot → prompt rows + ids accepted (its next step's position + 1)
        self.thread: int | None = None
        self.calls = {"prefill": 0, "step": 0, "complete": 0, "abort": 0}
        self.violations: list[str] = []

    @classmethod
    def around(cls, factory: Callable[..., TalkerBackend]) -> Callable[..., CheckedTalker]:
        return lambda model, spec: cls(factory(model, spec), spec)

    def _expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.violations.append(what)
            raise AssertionError(f"the core broke the TalkerBackend contract: {what}")

    def _call(self, name: str) -> None:
        me = threading.get_ident()
        self.thread = self.thread or me
        self._expect(self.thread == me, f"{name} from a second thread")
        self.calls[name] += 1

    def _batch(self, name: str, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int,
               want: str) -> None:
        self._expect(bucket in self.spec.buckets and 1 <= len(slots) <= bucket,
                     f"{name}: {len(slots)} rows, bucket {bucket}")
        self._expect(len(set(slots)) == len(slots) == len(params), f"{name}: slots {list(slots)}")
        for s, p in zip(slots, params, strict=True):
            self._expect(self.state.get(s) == want, f"{name} on slot {s} in state {self.state.get(s)}")
            self._expect(self.params[s] is p, f"{name}: slot {s} got another params object")

    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int:
        self._call("prefill")
        self._expect(0 <= slot < self.max_slots and slot not in self.state, f"prefill on slot {slot} not free")
        self._expect("pending" not in self.state.values(), "prefill while a frame is owed (no complete last cycle)")
        self._expect(0 < rows.shape[0] < self.max_context, f"prompt of {rows.shape[0]} rows")
        self.state[slot], self.params[slot], self.steps[slot] = "eos", params, rows.shape[0]
        cb0 = self.inner.prefill(slot, rows, params)
        self._accept(slot, cb0)
        return cb0

    def _accept(self, slot: int, cb0: int) -> None:
        if cb0 != self.eos_id:
            self.state[slot] = "pending"
            self.steps[slot] += 1

    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]:
        self._call("step")
        self._batch("step", slots, params, bucket, "ready")
        self._expect(text_rows.shape[0] == len(slots), f"step: {tuple(text_rows.shape)} text rows")
        for s in slots:
            self._expect(self.steps[s] <= self.max_context, f"slot {s} stepped at position {self.steps[s] - 1}")
        ids = self.inner.step(slots, text_rows, params, bucket)
        for s in slots:
            self.state[s] = "eos"
        for s, cb0 in zip(slots, ids, strict=True):
            self._accept(s, cb0)
        return ids

    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor:
        self._call("complete")
        self._batch("complete", slots, params, bucket, "pending")
        owed = {s for s, st in self.state.items() if st == "pending"}
        # One pass over every slot that produced codebook 0 — unless a batched call failed and the
        # core is re-running its rows one at a time (then one slot per call).
        self._expect(set(slots) == owed or len(slots) == 1, f"complete {sorted(slots)} while {sorted(owed)} are owed")
        frames = self.inner.complete(slots, params, bucket)
        for s in slots:
            self.state[s] = "ready"
        return frames

    def abort(self, slot: int) -> None:
        self._call("abort")
        self.state.pop(slot, None)
        self.params.pop(slot, None)
        self.steps.pop(slot, None)
        self.inner.abort(slot)

    def warm_up(self, buckets: Sequence[int]) -> dict[int, float]:
        self._expect(tuple(buckets) == self.spec.buckets and not any(self.calls.values()), "warm_up")
        return self.inner.warm_up(buckets)

    def slot_bytes(self) -> dict[str, int]:
        return self.inner.slot_bytes()

    def close(self) -> None:
        self.inner.close()


# ---- the checks ------------------------------------------------------------------------------------------
def check_protocol_shape(make: Make, model: Qwen3TTSModel) -> None:
    """The Protocol's attributes, and a warm-up that returns bucket → finite positive seconds."""
    backend = make(SPEC)
    try:
        assert isinstance(backend, TalkerBackend)
        assert (backend.max_slots, backend.max_context) == (SPEC.max_slots, SPEC.max_context)
        assert backend.eos_id == model.eos_id
        costs = backend.warm_up(SPEC.buckets)
        assert set(costs) <= set(SPEC.buckets)
        assert all(math.isfinite(c) and c > 0 for c in costs.values())
        parts = backend.slot_bytes()
        assert parts and all(isinstance(v, int) and v >= 0 for v in parts.values())
        backend.abort(3)  # a slot never prefilled: nothing to free, no error
    finally:
        backend.close()


def check_greedy_staggered_batch_equals_reference(make: Make, model: Qwen3TTSModel) -> None:
    """Four requests prefilled one a cycle into scattered slots, stepped together in changing order:
    each one's greedy codes equal the reference loop's for it alone."""
    backend = _new(make)
    try:
        runs = [Run(slot, _prompt(model, i), _greedy()) for i, slot in enumerate((5, 1, 3, 0))]
        drive(backend, SPEC, runs, order=-1)
        for r in runs:
            assert np.array_equal(r.codes(), _reference(model, r.prompt)), f"slot {r.slot}"
    finally:
        backend.close()


def check_a_slot_left_out_keeps_its_state(make: Make, model: Qwen3TTSModel) -> None:
    """A slot that sits out cycles (parked, paused) resumes exactly where it stopped: no padding fed."""
    backend = _new(make)
    try:
        runs = [Run(slot, _prompt(model, i), _greedy()) for i, slot in enumerate((2, 4, 0))]
        drive(backend, SPEC, runs, sit_out=lambda cycle, r: r.slot == 4 and 3 <= cycle < 9)
        for r in runs:
            assert np.array_equal(r.codes(), _reference(model, r.prompt)), f"slot {r.slot}"
    finally:
        backend.close()


def check_abort_frees_the_slot_for_a_fresh_request(make: Make, model: Qwen3TTSModel) -> None:
    """A request aborted mid-way leaves nothing behind: the next request in its slot speaks as if the
    slot were new (KV, repetition-penalty set, position all reset)."""
    backend = _new(make)
    try:
        cut = [Run(1, _prompt(model, 0), _greedy(), max_frames=4), Run(2, _prompt(model, 1), _greedy())]
        drive(backend, SPEC, cut)  # the driver aborts slot 1 after 4 frames, while slot 2 goes on
        again = [Run(1, _prompt(model, 2), _greedy()), Run(2, _prompt(model, 3), _greedy())]
        drive(backend, SPEC, again)
        for r in again:
            assert np.array_equal(r.codes(), _reference(model, r.prompt)), f"slot {r.slot}"
    finally:
        backend.close()


def check_seeded_sampling_reproduces_alone_and_batched(make: Make, model: Qwen3TTSModel) -> None:
    """A seeded request makes the same codes alone and beside other (greedy and sampled) rows."""
    def seeded(seed: int) -> SamplingParams:
        return SamplingParams.from_defaults(model.gen, seed=seed)

    backend = _new(make)
    try:
        alone = [Run(0, _prompt(model, 0), seeded(7))]
        drive(backend, SPEC, alone)
        batched = [Run(3, _prompt(model, 1), seeded(8)), Run(5, _prompt(model, 0), seeded(7)),
                   Run(0, _prompt(model, 2), _greedy())]
        drive(backend, SPEC, batched, order=-1)
        assert np.array_equal(alone[0].codes(), batched[1].codes())
    finally:
        backend.close()


def check_frames_handed_out_are_the_callers(make: Make, model: Qwen3TTSModel) -> None:
    """The frames `complete` returns are not overwritten by the next pass."""
    backend = _new(make)
    try:
        prompt, params = _prompt(model, 0), _greedy()
        assert backend.prefill(0, prompt.rows, params) != backend.eos_id
        first = backend.complete([0], [params], SPEC.buckets[0])
        kept = first.clone()
        if backend.step([0], prompt.trailing[:1], [params], SPEC.buckets[0])[0] != backend.eos_id:
            backend.complete([0], [params], SPEC.buckets[0])
        assert torch.equal(first, kept)
        backend.abort(0)
    finally:
        backend.close()


ALL_CHECKS: tuple[Callable[[Make, Qwen3TTSModel], None], ...] = (
    check_protocol_shape, check_greedy_staggered_batch_equals_reference, check_a_slot_left_out_keeps_its_state,
    check_abort_frees_the_slot_for_a_fresh_request, check_seeded_sampling_reproduces_alone_and_batched,
    check_frames_handed_out_are_the_callers,
)
