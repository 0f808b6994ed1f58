"""EngineCore: the one thread that owns every tensor of the Qwen3 engine (DESIGN §3).

Other threads only post commands (typed: `Open`, `Append`, `Finish`, `Cancel`, `Stop`) to a queue; the
core drains it at the top of every cycle, so a cancel takes effect before the next step. Each stream's
current request has one `Status` (engine/scheduler.py: waiting, running, parked, evicting, draining, …),
moved only along the transitions listed there. The talker is a `TalkerBackend` (engine/talker_backend.py):
the core hands it slot ids, prompt rows and text rows and gets codebook-0 ids and frames back, never
touching a talker tensor; the core keeps the slot ids and each slot's codec state. A cycle:

    drain commands → hand queued audio to consumers → plan (engine/scheduler.py) →
    ≤1 prefill + one batched talker step → one batched code-predictor pass for every row that produced
    codebook 0 → code2wav chunks batched by size → end finished streams

Streaming text in: each request has a text track (one projected text row per frame). `append` extends
it; a request whose track runs dry before `finish()` is parked (skipped, not fed padding) and resumes
when text arrives; `finish()` appends the end-of-text row, after which the talker is fed padding rows
until EOS or the request's frame cap. Audio leaves through a bounded `EventBridge` per stream; a chunk
the bridge will not take stays in the request's one-chunk outbox and the request is paused (not
advanced) until its consumer reads again. A failure inside one request's work ends that stream with
`StreamEnd("error")`; a failing batched call is retried row by row so only the culprit ends.

One stream, one request at a time, as many requests as it takes. A request ends at a segment boundary
(the end-of-text row fed after a whole `append` piece) and the stream goes on in a fresh one — same
voice, the same seeded generator, the codec decoder state carried over so the audio continues —
whenever the next piece would not fit the request's KV context (the frame cap: no text is cut), and
when a request parked past `park_evict_s` gives its slot to a stream waiting for one. Text a request
took but the model did not consume (it said EOS early) goes back to the stream's pending text.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.options import quote_text
from engine.qwen3.codec import CodecState
from engine.qwen3.model import Qwen3TTSModel, SamplingParams
from engine.qwen3.prompt import VoiceClone
from engine.reference import VoiceMaker
from engine.resample import Resampler
from engine.scheduler import (
    DEFAULT_RAMP,
    RequestRecord,
    Scheduler,
    SchedulerConfig,
    Status,
    ThroughputMeter,
    bucket_sizes,
)
from engine.slots import SlotPool
from engine.stream import EventBridge
from engine.talker_backend import TalkerBackend, TalkerFactory, TalkerSpec, talker_factory
from engine.types import AudioChunk, CodecFrames, Waiting

log = logging.getLogger("voxgate.engine.core")

# Frames per text row (`EngineCore.frames_per_row`): measured once this many requests ended by EOS, then
# an EWMA of weight PACE_ALPHA.
PACE_MIN = 3
PACE_ALPHA = 0.2


@dataclass(frozen=True, slots=True)
class CoreConfig:
    max_streams: int = 32  # slots: streams admitted at once (more wait for a free slot)
    max_context: int = 2048  # KV positions per slot: prompt + frames (2048 frames ≈ 164 s of audio)
    max_batch: int = 32  # talker rows per step
    ramp: tuple[int, ...] = DEFAULT_RAMP
    # Streams per batched decode (and a cycle decodes up to the frames of this many full chunks). Tiny
    # model, 2 cores: 4 beat 8 in paired bench runs (16 streams: 514 vs 347 frames per CPU-s; 32: 600 vs
    # 428) and 16 was worse again: a large decode's activations (16 × 25 frames × 1920 samples ×
    # channels) no longer fit in cache.
    max_codec_rows: int = 4
    queue_size: int = 8  # audio chunks buffered per stream before its consumer is considered not reading
    # torch intra-op threads of the core thread. 1 for the tiny model: with 2 on 2 busy cores a tiny
    # attention call took 10.5 ms instead of 6 µs (waking the second thread). A real checkpoint's
    # GEMMs on CPU want more.
    threads: int = 1
    frames_per_token: float = 6.0  # frame cap: text tokens × this + min_frames (real speech: ~2–4)
    min_frames: int = 24
    kv_block: int = 64  # attention key lengths are rounded up to this (few distinct shapes)
    # Smallest batch bucket. On CPU a row's logits were bitwise equal in every batch of >= 4 rows but
    # differed by ~1e-6 at 1, 2 or 3 (GEMM kernel choice): enough to flip a sampled id now and then,
    # so a seeded stream would not reproduce alone vs. batched. Padding one stream to 4 rows costs
    # little: a single-row step is bound by reading the weights, not by arithmetic.
    min_bucket: int = 4
    low_water_s: float = 1.0
    defer_s: float = 2.0
    # A stream's first audio waits (at most this long past its first frame) while the rest of its text
    # is predicted to come after its listener needs it (`Scheduler.holds_first`); 0: never held. Text
    # still to come (not finished) counts as `hold_more_s` of audio more.
    first_hold_s: float = 2.0
    hold_more_s: float = 1.5
    warm_up: bool = True
    # Capture the talker step and the code-predictor pass as CUDA graphs (engine/graphs.py). Off the
    # GPU it warns once and runs the same static-buffer path uncaptured.
    cuda_graphs: bool = False
    # A request parked (its text ran dry before finish()) this long gives its slot up when another
    # stream waits for one: it speaks the text it has to its end, and the stream resumes in a fresh
    # request when text comes. Long enough that a pause between two sentences keeps the slot.
    park_evict_s: float = 1.0
    # Text a stream may hold that no request has taken yet; an append past it is refused (`queue_full`).
    # A backstop: the gateway bounds the text committed ahead of the audio far below this.
    max_pending_chars: int = 262144
    # Benchmarks only: every stream ends ("done") after this many frames, whatever text it has left,
    # so streams of one run are equally long. None in service: no committed text goes unspoken.
    max_frames: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= self.max_streams:
            raise ValueError(f"max_batch must be in [1, max_streams={self.max_streams}], got {self.max_batch}")
        # Below one frame per token a request's frame cap could stop before its text was all fed.
        if not (math.isfinite(self.frames_per_token) and self.frames_per_token >= 1.0) or self.min_frames < 1:
            raise ValueError(f"need frames_per_token >= 1 and min_frames >= 1, got {self.frames_per_token}, "
                             f"{self.min_frames}")
        if not (math.isfinite(self.park_evict_s) and self.park_evict_s >= 0):
            raise ValueError(f"park_evict_s must be a number >= 0, got {self.park_evict_s}")
        if not all(math.isfinite(v) and v >= 0 for v in (self.first_hold_s, self.hold_more_s)):
            raise ValueError(f"need first_hold_s and hold_more_s >= 0, got {self.first_hold_s}, {self.hold_more_s}")


# ---- commands into the core (any thread → the core's queue) -------------------------------------------
@dataclass(frozen=True, slots=True)
class Open:
    rid: int
    opts: StreamOptions
    bridge: EventBridge
    ledger: TextLedger


@dataclass(frozen=True, slots=True)
class Append:
    rid: int
    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    rid: int


@dataclass(frozen=True, slots=True)
class Cancel:
    rid: int
    at: float  # perf_counter() when cancel() was called: the core records how long freeing took


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Open | Append | Finish | Cancel | Stop


@dataclass
class StreamOptions:
    speaker: str | None
    language: str  # model language name ("english", "auto", ...)
    instructions: str | None
    sample_rate: int
    params: SamplingParams
    codec_tokens: bool = False  # stream the talker's frames; no code2wav for this stream
    reference: tuple[bytes, str | None] | None = None  # a cloned voice: its clip's file bytes, transcript
    # A continuation: the seconds of earlier audio its listener has still to hear when it opens
    # (`StreamRequest.listener_buffer_s`); the first-audio hold lets go before they run out.
    listener_buffer_s: float | None = None


@dataclass(frozen=True)
class ClonedVoice:
    """A Base-model voice made from a reference clip, once (the core's `VoiceMaker`)."""

    clone: VoiceClone
    ref_ids: list[int]  # the transcript's ids (ICL)
    primed: CodecState | None  # ICL: the codec state after decoding the reference frames


@dataclass
class TextLedger:
    """Characters of one stream's text: `appended` counted on the caller's thread, `taken` (into a
    request's prompt or track) on the core's; each has one writer, so plain ints do."""

    appended: int = 0
    taken: int = 0

    @property
    def pending(self) -> int:
        return self.appended - self.taken


@dataclass
class CoreRequest:
    """One stream, and the request (prompt, KV slot, text track) now speaking it. Everything per request
    is bounded by its KV context; per stream only the pending text (bounded by what the caller commits
    ahead of the audio) and counters."""

    rid: int
    opts: StreamOptions
    bridge: EventBridge
    record: RequestRecord
    pending_text: deque[tuple[int, str]] = field(default_factory=deque)  # (segment, text) no request took yet
    voice: ClonedVoice | Future[ClonedVoice] | None = None  # a future while its clip is being made into a voice
    segments: int = 0  # append calls so far
    carry: str = ""  # whitespace cut from the end of the last piece (it belongs before the next word)
    finished: bool = False
    prompt_rows: int | None = None  # rows of this stream's prompts (the voice decides; the text does not)
    # ---- the request now speaking (reset when the next one starts)
    slot: int | None = None
    requests: int = 0  # requests started for this stream
    track: torch.Tensor | None = None  # [N, H] text rows; frame g+1's talker input uses row g
    ids: list[int] = field(default_factory=list)  # content ids of this request's text (the prompt's too)
    token_segments: list[int] = field(default_factory=list)  # segment of each content token
    track_offset: int = 1  # content index of text row 0 (ICL: see _admit)
    extra_rows: int = 0  # track rows that are not content: an ICL transcript longer than its reference
    eos_fed: bool = False
    ended_by_eos: bool = False  # the model said EOS (else the frame cap stopped it)
    pad_row: torch.Tensor | None = None
    prompt_len: int = 0
    frames: int = 0  # frames of this request completed by the code predictor
    codes: list[torch.Tensor] = field(default_factory=list)  # completed, not yet decoded [16] each
    frames_decoded: int = 0
    # ---- the stream
    frames_before: int = 0  # frames of its earlier requests
    codec_carry: CodecState | None = None  # the decoder state between two requests (pcm output)
    samples_out: int = 0  # PCM samples handed out, at the stream's rate
    last_segment: int = 0  # segment of the latest audio
    fed_tokens: int = 0  # content tokens the talker consumed, all requests
    fed_segments: int = 0  # segments with tokens consumed
    fed_last: int = -1  # the latest of them
    waiting_told: bool = False  # a Waiting notice went out for the current wait
    resampler: Resampler | None = None
    outbox: deque[AudioChunk | CodecFrames | Waiting] = field(default_factory=deque)
    ledger: TextLedger = field(default_factory=TextLedger)

    @property
    def ended(self) -> bool:
        return self.record.ended

    @property
    def n_tokens(self) -> int:
        return len(self.token_segments)

    def at_max_frames(self, max_frames: int | None) -> bool:
        return max_frames is not None and self.frames_before + self.frames >= max_frames


class EngineCore:
    """The engine thread. Thread-safe entry points: `submit`, `append`, `finish`, `cancel`, `stop`."""

    def __init__(self, model: Qwen3TTSModel, config: CoreConfig = CoreConfig(),
                 clock: Callable[[], float] = time.monotonic, talker: str | TalkerFactory = "native",
                 talker_options: dict[str, Any] | None = None) -> None:
        """`talker`: a registered name (engine/talker_backend.py `TALKERS`) or a factory, built on this
        core's thread; `talker_options` go to it as `TalkerSpec.options`."""
        self.model, self.config, self.clock = model, config, clock
        self._talker_factory = talker_factory(talker)
        self._talker_options = dict(talker_options or {})
        self.frame_seconds = model.samples_per_frame / model.sample_rate
        buckets = bucket_sizes(config.max_batch, min_bucket=config.min_bucket)
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch=config.max_batch, buckets=buckets, ramp=config.ramp, max_codec_rows=config.max_codec_rows,
            low_water_s=config.low_water_s, defer_s=config.defer_s, first_hold_s=config.first_hold_s,
            frames_per_s=1.0 / self.frame_seconds,
        ))
        self._commands: deque[Command] = deque()
        self._wake = threading.Event()
        self._ids = itertools.count(1)
        self._requests: dict[int, CoreRequest] = {}
        self._stopping = False
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.stats: dict[str, Any] = {"cycles": 0, "prefills": 0, "talker_rows": 0, "frames": 0, "decode_calls": 0}
        #: recent durations of cycles that did work, and of cancel() → slot freed (bench and tests)
        self.cycle_s: deque[float] = deque(maxlen=4096)
        self.cancel_latency_s: deque[float] = deque(maxlen=4096)
        #: CPU seconds this thread spent in working cycles: capacity on a shared machine, where wall time
        #: also counts other processes' turns
        self.cpu_s = 0.0
        #: frames per stream per second at each batch bucket, measured cycle by cycle: capacity (issue 14)
        self.meter = ThroughputMeter(buckets)
        self._cycle_work = (0, 0)  # (rows generating, frames completed) of the cycle that just ran
        #: frames per text row of requests the model ended (EOS), an EWMA; None until `PACE_MIN` are: what
        #: a stream's text is expected to take, for the first-audio hold (`_frames_left`)
        self.frames_per_row: float | None = None
        self._paced = 0
        #: frames each stream made, recorded when it finished (tests and the bench check audio against it)
        self.finished_frames: dict[int, int] = {}
        #: (requests, segments with consumed tokens, consumed content tokens) of each finished stream
        self.finished_text: dict[int, tuple[int, int, int]] = {}
        self.pool: SlotPool | None = None  # slot ids and codec state: the core's side of the slots
        self.talker: TalkerBackend | None = None  # the talker, with its own side of the slots
        self.voices: VoiceMaker[ClonedVoice] = VoiceMaker(self._clone, on_done=self._wake.set)
        self._buckets = buckets
        self._thread = threading.Thread(target=self._main, name="qwen3-engine-core", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    # ---- entry points (any thread) -------------------------------------------------------------------
    def submit(self, opts: StreamOptions, bridge_factory: Callable[[int], EventBridge],
               ledger: TextLedger | None = None) -> tuple[int, EventBridge]:
        rid = next(self._ids)
        bridge = bridge_factory(rid)
        self._post(Open(rid, opts, bridge, ledger or TextLedger()))
        return rid, bridge

    def append(self, rid: int, text: str) -> None:
        self._post(Append(rid, text))

    def finish(self, rid: int) -> None:
        self._post(Finish(rid))

    def cancel(self, rid: int) -> None:
        self._post(Cancel(rid, time.perf_counter()))

    def stop(self) -> None:
        self._post(Stop())
        self._thread.join(timeout=30)

    def bytes_per_slot(self) -> dict[str, int]:
        """Bytes each slot holds, by part: the talker's (KV, carry) and the core's codec state."""
        if self.pool is None or self.talker is None:
            return {}
        return {**self.talker.slot_bytes(), **self.pool.bytes_per_slot()}

    @property
    def free_slots(self) -> int:
        return self.pool.available if self.pool is not None else 0

    @property
    def active(self) -> int:
        return len(self._requests)

    def _post(self, cmd: Command) -> None:
        self._commands.append(cmd)  # deque.append is atomic: no lock on the caller's side
        self._wake.set()

    # ---- the thread ------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            # Intra-op threads of this thread's torch work: set here, deliberately, not inherited.
            torch.set_num_threads(self.config.threads)
            t0 = time.perf_counter()
            cfg = self.config
            self.pool = SlotPool.allocate(self.model, cfg.max_streams)
            self.talker = self._talker_factory(self.model, TalkerSpec(
                cfg.max_streams, cfg.max_context, self._buckets, kv_block=cfg.kv_block, cuda_graphs=cfg.cuda_graphs,
                options=self._talker_options))
            if (self.talker.max_slots, self.talker.max_context) != (cfg.max_streams, cfg.max_context):
                raise ValueError(f"the talker holds {self.talker.max_slots} slots × {self.talker.max_context} "
                                 f"positions; the core needs {cfg.max_streams} × {cfg.max_context}")
            if cfg.warm_up:
                self._warm_up()
            per_slot = self.bytes_per_slot()
            log.info("Qwen3 engine core: %d slots × %d positions, %d bytes per slot (%s), buckets %s, "
                     "%d threads, ready in %.2f s", self.config.max_streams, self.config.max_context,
                     sum(per_slot.values()), per_slot, self._buckets, self.config.threads, time.perf_counter() - t0)
        except BaseException as exc:  # reported to the constructor's caller
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        with torch.no_grad():
            while not self._stopping:
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    worked = self._cycle()
                except Exception:  # a bug outside any one request: log it, keep serving
                    log.exception("engine core cycle failed")
                    worked = False
                if worked:
                    dt = time.perf_counter() - t0
                    self.cycle_s.append(dt)
                    self.cpu_s += time.thread_time() - c0
                    self.meter.record(*self._cycle_work, dt)
                else:
                    self._idle()
        for req in list(self._requests.values()):
            self._end(req, "error", "the engine was closed")
        self.voices.close()
        if self.talker is not None:
            with contextlib.suppress(Exception):
                self.talker.close()

    def _warm_up(self) -> None:
        assert self.talker is not None and self.pool is not None
        self.meter.set_step_costs(self.talker.warm_up(self._buckets))
        state = self.model.codec.new_state(1)
        for n in sorted(set(self.config.ramp)):
            self.model.codec.step(torch.zeros(1, 16, n, dtype=torch.long, device=self.model.device), state)

    def _idle(self) -> None:
        # A paused stream is waiting for its consumer, which signals nothing: poll it briefly.
        paused = any(r.outbox for r in self._requests.values())
        self._wake.wait(0.005 if paused else 0.5)
        self._wake.clear()

    def _cycle(self) -> bool:
        self._drain_commands()
        self._flush_outboxes()
        self._collect_voices()
        now = self.clock()
        assert self.pool is not None
        live = [r for r in self._requests.values() if not r.ended]
        for r in live:
            self._refresh(r, now)
        for rid in self.scheduler.plan_evictions((r.record for r in live), now, self.pool.available):
            self._evict(self._requests[rid])
        plan = self.scheduler.plan_talker((r.record for r in live), now, self.pool.available)
        for rid, ahead in plan.blocked:
            self._tell_waiting(self._requests[rid], ahead)
        worked = False
        produced: list[CoreRequest] = []
        # The rows this cycle's time is charged to: those planned, or in a decode-only cycle the streams
        # holding a slot (their decodes are what it spends its time on).
        rows = len(plan.step) + (plan.prefill is not None) or sum(1 for r in live if r.slot is not None)
        if plan.prefill is not None:
            req = self._requests[plan.prefill]
            if self._admit(req):
                produced.append(req)
            worked = True
        if plan.step:
            produced += self._step([self._requests[rid] for rid in plan.step], plan.bucket)
            worked = True
        if produced:
            self._complete(produced, self.scheduler.bucket(len(produced)))
        self._cycle_work = (rows, len(produced))
        now = self.clock()
        # The slowest recent cycle, not the typical one: a listener runs dry in the slow ones.
        cycle_s = max(itertools.islice(reversed(self.cycle_s), 8), default=0.0)
        generating = sum(1 for r in live if r.record.generating)
        rate = self.meter.stream_rate(self.meter.bucket(generating)) if generating else None
        codec = self.scheduler.plan_codec((r.record for r in live if not r.ended), now, plan.pressing, cycle_s, rate)
        for size, rids in codec.batches(self.config.max_codec_rows):
            self._decode([self._requests[rid] for rid in rids], size)
            worked = True
        for r in live:
            if not r.ended:
                self._maybe_done(r)
        self._flush_outboxes()
        self.stats["cycles"] += 1
        return worked

    # ---- commands --------------------------------------------------------------------------------
    def _drain_commands(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if isinstance(cmd, Stop):
                self._stopping = True
                continue
            if isinstance(cmd, Open):
                opts = cmd.opts
                now = self.clock()
                req = self._requests[cmd.rid] = CoreRequest(cmd.rid, opts, cmd.bridge,
                                                            RequestRecord(cmd.rid, now), ledger=cmd.ledger)
                if opts.listener_buffer_s is not None:
                    req.record.continues_at = now + opts.listener_buffer_s
                if opts.sample_rate != self.model.sample_rate:
                    req.resampler = Resampler(self.model.sample_rate, opts.sample_rate)
                if opts.reference is not None:
                    req.voice = self.voices.get(*opts.reference)
                continue
            req = self._requests.get(cmd.rid)
            if req is None or req.ended:
                continue  # a late command for a stream that has ended: nothing to do
            try:
                match cmd:
                    case Append(text=text):
                        self._on_append(req, text)
                    case Finish():
                        self._on_finish(req)
                    case Cancel(at=at):
                        self._release(req)
                        req.record.to(Status.ENDED)
                        self._requests.pop(req.rid, None)
                        self.cancel_latency_s.append(time.perf_counter() - at)
            except Exception as exc:
                self._fail(req, exc)

    def _on_append(self, req: CoreRequest, text: str) -> None:
        seg = req.segments
        req.segments += 1
        if req.finished:
            raise RuntimeError("append after finish")
        if req.slot is None or req.eos_fed:  # for the next request
            req.pending_text.append((seg, text))
            if req.slot is None:
                req.record.has_text = req.record.has_text or self._can_admit(req)  # more text never un-readies
            return
        ids, carry = self._piece_ids(req.carry, text)
        if not ids:
            req.carry = carry
            req.ledger.taken += len(text)
            return
        if len(req.ids) + len(ids) > self._budget(req):
            # The piece would not fit this request's KV context: the request ends here, at the segment
            # boundary, and the next one starts with this piece.
            req.pending_text.append((seg, text))
            self._feed_eos(req)
            return
        req.carry = carry
        req.ledger.taken += len(text)
        self._extend_track(req, seg, ids)

    def _on_finish(self, req: CoreRequest) -> None:
        req.finished = True
        if req.slot is not None:
            if not self._has_pending(req):
                self._feed_eos(req)  # else the request already ends at a boundary; the last one gets it
        elif self._has_pending(req):
            req.record.has_text = self._can_admit(req)
        else:
            self._complete_stream(req)  # nothing (more) to say

    def _collect_voices(self) -> None:
        """Requests whose cloned voice the maker finished: the voice, or the stream ends with its error."""
        for req in list(self._requests.values()):
            if isinstance(req.voice, Future) and req.voice.done() and not req.ended:
                try:
                    req.voice = req.voice.result()
                except Exception as exc:
                    self._fail(req, exc)
                    continue
                req.record.has_text = self._can_admit(req)

    # ---- capacity --------------------------------------------------------------------------------
    def _evict(self, req: CoreRequest) -> None:
        """A parked request gives its slot to a stream waiting for one: its end of text is fed now, so it
        speaks what it has to its end (EOS or frame cap) and frees the slot; the stream's later text
        starts a fresh request when a slot is free again."""
        log.info("stream %d: parked %.1f s while a stream waits for a slot: it ends its request and resumes "
                 "in a new one", req.rid, self.clock() - (req.record.parked_since or self.clock()))
        self._feed_eos(req)
        req.record.to(Status.EVICTING)
        self.stats["evictions"] = self.stats.get("evictions", 0) + 1

    def _tell_waiting(self, req: CoreRequest, ahead: int) -> None:
        if not req.waiting_told:
            req.waiting_told = True
            req.outbox.append(Waiting("capacity", ahead))

    # ---- admission ---------------------------------------------------------------------------------
    def _icl(self, req: CoreRequest) -> bool:
        return isinstance(req.voice, ClonedVoice) and req.voice.clone.icl

    def _has_pending(self, req: CoreRequest) -> bool:
        return any(text.strip() for _, text in req.pending_text)

    def _voice_arg(self, req: CoreRequest) -> VoiceClone | str | None:
        return req.voice.clone if isinstance(req.voice, ClonedVoice) else req.opts.speaker

    def _prompt_rows(self, req: CoreRequest) -> int:
        """Rows of this stream's prompts: instructions, role, codec prefix, the first text token — and an
        ICL clone's reference frames. The voice decides; the length of the text does not."""
        if req.prompt_rows is None:
            probe = self.model.tokenizer.content_ids("a")[:1]
            req.prompt_rows = self.model.build_prompt(
                probe, voice=self._voice_arg(req), language=req.opts.language,
                instructions=req.opts.instructions, streaming_text=True, final=True,
            ).rows.shape[0]
        return req.prompt_rows

    def _ref_overflow(self, req: CoreRequest) -> int:
        """Transcript tokens of an ICL clone beyond its reference frames: they ride the text track."""
        if not self._icl(req):
            return 0
        assert isinstance(req.voice, ClonedVoice) and req.voice.clone.ref_codes is not None
        return max(0, len(req.voice.ref_ids) - req.voice.clone.ref_codes.shape[0] - 1)

    def _budget(self, req: CoreRequest) -> int:
        """Content tokens one request may take: its frame cap for them (min_frames + frames_per_token per
        track row) must fit the slot's KV positions after the prompt, so the cap never cuts text."""
        room = self.config.max_context - self._prompt_rows(req) - self.config.min_frames
        return math.floor(room / self.config.frames_per_token) - self._ref_overflow(req)

    def _can_admit(self, req: CoreRequest) -> bool:
        """A prompt can be built from the pending text, and the voice is ready. An ICL clone's prompt
        sums the text track (transcript ++ text) with the reference frames row by row, so before
        `finish()` it waits until the text covers them (or fills a whole request): then later text only
        extends the trailing queue, exactly as if the whole text had come at once."""
        if req.ended or req.slot is not None or isinstance(req.voice, Future) or not self._has_pending(req):
            return False
        if req.finished or not self._icl(req):
            return True
        try:
            assert isinstance(req.voice, ClonedVoice) and req.voice.clone.ref_codes is not None
            cover = req.voice.clone.ref_codes.shape[0] + 1 - len(req.voice.ref_ids)
            enough = min(cover, self._budget(req))
            return enough <= 0 or self._pending_tokens(req, enough) >= enough
        except Exception:  # _admit meets the same failure and ends the stream with it
            return True

    def _pending_tokens(self, req: CoreRequest, enough: int) -> int:
        """Content tokens of the pending text, counted until `enough`."""
        n, carry, first = 0, "", True
        for _, text in req.pending_text:
            stripped = text.rstrip()
            if not stripped:
                carry += text
                continue
            n += len(self.model.tokenizer.content_ids(stripped) if first else self._piece_ids(carry, text)[0])
            first, carry = False, text[len(stripped):]
            if n >= enough:
                break
        return n

    def _take(self, req: CoreRequest, budget: int) -> tuple[list[int], list[int]]:
        """The pending pieces one request speaks: whole pieces while they fit `budget` tokens (a piece
        alone larger than that is cut at a word boundary, its rest left pending) → (content ids, segment
        of each). The first piece is tokenized as the prompt's text; each later one with the whitespace
        carried from the piece before it."""
        ids: list[int] = []
        segments: list[int] = []
        pending = req.pending_text
        carry = ""
        while pending:
            seg, text = pending[0]
            stripped = text.rstrip()
            if not stripped:
                carry += text
                req.ledger.taken += len(text)
                pending.popleft()
                continue
            piece = self.model.tokenizer.content_ids(stripped) if not ids else self._piece_ids(carry, text)[0]
            if len(ids) + len(piece) > budget:
                if ids:
                    break  # the next request takes it
                head, tail = self._cut(stripped, budget)
                pending[0] = (seg, tail + text[len(stripped):])
                req.ledger.taken += len(text) - len(pending[0][1])
                piece = self.model.tokenizer.content_ids(head)
                ids, segments, carry = piece, [seg] * len(piece), ""
                break
            ids += piece
            segments += [seg] * len(piece)
            carry = text[len(stripped):]
            req.ledger.taken += len(text)
            pending.popleft()
        req.carry = carry
        return ids, segments

    def _cut(self, text: str, budget: int) -> tuple[str, str]:
        """`text` (longer than `budget` tokens) → a head of at most `budget` tokens, ending at a word
        boundary where there is one, and the rest."""
        starts = [a for a, _ in self.model.tokenizer.tok.encode(text, add_special_tokens=False).offsets]
        k = min(budget, len(starts) - 1)  # the head is tokens [0, k)
        while k > 0:
            # A token next to whitespace starts a word; CJK text has none: cut between tokens then.
            words = [c for c in range(k, 0, -1) if text[starts[c] - 1].isspace() or text[starts[c]].isspace()]
            cut = words[0] if words else k
            head, tail = text[:starts[cut]].rstrip(), text[starts[cut]:].lstrip()
            if head and len(self.model.tokenizer.content_ids(head)) <= budget:
                return head, tail
            k = cut - 1
        raise ValueError(f"cannot cut {len(text)} characters into pieces of {budget} tokens")

    # ---- text track ------------------------------------------------------------------------------
    def _piece_ids(self, carry: str, text: str) -> tuple[list[int], str]:
        """Token ids of one appended piece, and the new carry. Segments end with a space; it is held back
        and put before the next piece, where Qwen's BPE expects it (" world", not "hello " + "world")."""
        stripped = text.rstrip()
        if not stripped:
            return [], carry + text
        return self.model.tokenizer.encode(carry + stripped), text[len(stripped):]

    def _extend_track(self, req: CoreRequest, seg: int, ids: list[int]) -> None:
        rows = self.model.prompts.text_rows(ids)
        assert req.track is not None
        req.track = torch.cat([req.track, rows])
        req.ids += ids
        req.token_segments += [seg] * len(ids)

    def _feed_eos(self, req: CoreRequest) -> None:
        if not req.eos_fed:
            assert req.track is not None
            req.track = torch.cat([req.track, self.model.prompts.eos_row()])
            req.eos_fed = True

    def _refresh(self, req: CoreRequest, now: float) -> None:
        """Parked: admitted, still generating, and no text row for its next step yet. Before the first
        audio, the frames its text is expected to take past those made (the first-audio hold)."""
        rec = req.record
        rec.paused = bool(req.outbox)
        if rec.status in (Status.RUNNING, Status.PARKED):
            parked = self._next_text_row(req) is None
            if parked != rec.parked:
                rec.to(Status.PARKED if parked else Status.RUNNING, now)
        if rec.first_audio_at is None and req.slot is not None:
            rec.frames_left = self._frames_left(req)

    def _frames_left(self, req: CoreRequest) -> float:
        """Frames the stream's known text is expected to take past those made: its request's text rows
        at the measured frames per row (before `PACE_MIN` requests are measured, one: the least a row
        takes, as the talker reads one a frame; a fresh server's hold is never longer than its text
        surely needs), at most the frame cap, and `hold_more_s` of audio for text still to come (not
        finished, or pending for a next request)."""
        per_row = self.frames_per_row if self.frames_per_row is not None else 1.0
        expected = per_row * (req.n_tokens + req.extra_rows)
        left = max(0.0, min(expected, self.frame_cap(req)) - req.frames)
        if not req.finished or self._has_pending(req):
            left += self.config.hold_more_s / self.frame_seconds
        return left

    def _pace(self, req: CoreRequest) -> None:
        """A request the model ended (EOS) tells how many frames a text row takes (`frames_per_row`)."""
        rows = req.n_tokens + req.extra_rows
        if not req.ended_by_eos or rows <= 0 or req.frames <= 0:
            return
        ratio = req.frames / rows
        self._paced += 1
        if self.frames_per_row is None:
            if self._paced >= PACE_MIN:
                self.frames_per_row = ratio
            return
        self.frames_per_row += PACE_ALPHA * (ratio - self.frames_per_row)

    def _next_text_row(self, req: CoreRequest) -> torch.Tensor | None:
        assert req.track is not None
        g = req.frames - 1  # the step that makes frame `frames` consumes text row frames-1
        if g < req.track.shape[0]:
            return req.track[g]
        return req.pad_row if req.eos_fed else None

    def frame_cap(self, req: CoreRequest) -> int:
        """Frames a request may make: from its text length (a model that never emits EOS must stop),
        and never past its slot's KV positions (`_budget` keeps the first below the second)."""
        rows = req.n_tokens + req.extra_rows
        by_text = self.config.min_frames + math.ceil(self.config.frames_per_token * rows)
        return min(by_text, self.config.max_context - req.prompt_len)

    @torch.no_grad()
    def _clone(self, audio: np.ndarray, rate: int, transcript: str | None) -> ClonedVoice:
        """A reference clip → the voice (x-vector; with a transcript and the codec encoder, ICL frames),
        and for ICL the codec state primed with the reference frames, so the first chunk continues
        the reference's audio instead of starting from silence. Runs on the `VoiceMaker`'s thread: the
        modules keep no state between calls (the decoder's state is the `CodecState` passed in)."""
        clone = self.model.clone_voice(audio, rate, ref_text=transcript)
        if not clone.icl:
            return ClonedVoice(clone, [], None)
        assert clone.ref_codes is not None and clone.ref_text is not None
        primed = self.model.codec.new_state(1)
        self.model.codec.step(clone.ref_codes.T[None].to(self.model.device), primed)
        return ClonedVoice(clone, self.model.tokenizer.ref_ids(clone.ref_text), primed)

    # ---- talker ----------------------------------------------------------------------------------
    def _admit(self, req: CoreRequest) -> bool:
        """Start the stream's next request: take the pending text that fits one request, build its
        prompt and prefill it into a free slot. The request is closed (its end of text fed) when text is
        left for the next one, at `finish()`, and for an ICL clone whose text does not cover the
        reference. True when it produced codebook 0 of its first frame."""
        assert self.pool is not None and self.talker is not None
        try:
            budget = self._budget(req)
            if budget < 1:
                raise ValueError(f"this voice's prompt takes {self._prompt_rows(req)} of the "
                                 f"{self.config.max_context} KV positions: no room left for text")
            ids, segments = self._take(req, budget)
            req.ids, req.token_segments, req.track_offset = ids, segments, 0  # (a failure from here names them)
            rest = self._has_pending(req)
            icl = self._icl(req)
            if icl:
                assert isinstance(req.voice, ClonedVoice) and req.voice.clone.ref_codes is not None
                ref, n_ref = len(req.voice.ref_ids), req.voice.clone.ref_codes.shape[0] + 1
                covers = ref + len(ids) >= n_ref
                # The prompt sums the first n_ref rows of transcript ++ text with the reference frames;
                # the rest (transcript tokens first, if it is longer) rides the track.
                req.extra_rows = max(0, ref - n_ref)
                req.track_offset = max(0, min(ref + len(ids), n_ref) - ref) - req.extra_rows
            else:
                covers, req.extra_rows, req.track_offset = True, 0, 1
            closed = rest or req.finished or not covers
            prompt = self.model.build_prompt(
                ids, voice=self._voice_arg(req), language=req.opts.language,
                instructions=req.opts.instructions, streaming_text=True, final=closed,
            )
            req.track, req.pad_row, req.prompt_len = prompt.trailing, prompt.pad, prompt.rows.shape[0]
            req.eos_fed = closed
            first = req.requests == 0
            req.requests += 1
            req.slot = self.pool.acquire()
            req.record.to(Status.RUNNING)
            req.waiting_told = False
            if req.codec_carry is not None:  # the audio of the stream's last request goes on
                self.pool.codec.put([req.slot], req.codec_carry)
                req.codec_carry = None
            elif first and isinstance(req.voice, ClonedVoice) and req.voice.primed is not None:
                self.pool.codec.put([req.slot], req.voice.primed)  # continue the reference
                if req.opts.codec_tokens:  # the listener's decoder continues it too
                    ref_codes = req.voice.clone.ref_codes
                    assert ref_codes is not None
                    req.outbox.append(CodecFrames(ref_codes.to(torch.int16).numpy(), -ref_codes.shape[0], 0,
                                                  prime=True))
            self.stats["prefills"] += 1
            cb0 = self.talker.prefill(req.slot, prompt.rows, req.opts.params)
        except Exception as exc:
            self._fail(req, exc)
            return False
        if cb0 == self.talker.eos_id:
            req.ended_by_eos = True
            self._talker_done(req)
            return False
        return True

    def _step(self, reqs: list[CoreRequest], bucket: int) -> list[CoreRequest]:
        """One batched talker step; returns the requests that produced codebook 0 (not EOS)."""
        assert self.talker is not None

        def run(batch: list[CoreRequest], b: int) -> list[int]:
            rows = []
            for r in batch:
                row = self._next_text_row(r)
                assert row is not None  # the scheduler never plans a parked request
                rows.append(row)
            assert self.talker is not None
            return self.talker.step([r.slot for r in batch], torch.stack(rows),  # type: ignore[misc]
                                    [r.opts.params for r in batch], b)

        results = self._isolated(reqs, bucket, run)
        out = []
        for r, cb0 in results:
            self.stats["talker_rows"] += 1
            if cb0 == self.talker.eos_id:
                r.ended_by_eos = True
                self._talker_done(r)
            else:
                out.append(r)
        return out

    def _complete(self, reqs: list[CoreRequest], bucket: int) -> None:
        """The code predictor for every row that produced codebook 0 this cycle, in one pass."""

        def run(batch: list[CoreRequest], b: int) -> list[torch.Tensor]:
            assert self.talker is not None
            frames = self.talker.complete([r.slot for r in batch], [r.opts.params for r in batch], b)  # type: ignore[misc]
            return list(frames)

        now = self.clock()
        for r, frame in self._isolated(reqs, bucket, run):
            if r.opts.codec_tokens:  # the frame leaves as it is: its listener decodes it
                segment = r.token_segments[min(r.frames, r.n_tokens - 1)] if r.token_segments else 0
                r.outbox.append(CodecFrames(frame.to(torch.int16).cpu().numpy()[None], r.frames_before + r.frames,
                                            segment))
                r.last_segment = segment
                r.record.audio_s += self.frame_seconds
                if r.record.first_audio_at is None:
                    r.record.first_audio_at = now
            else:
                r.codes.append(frame)
                r.record.pending_frames += 1
                if r.record.first_frame_at is None:
                    r.record.first_frame_at = now
            r.frames += 1
            self.stats["frames"] += 1
            if r.frames >= self.frame_cap(r) or r.at_max_frames(self.config.max_frames):
                self._talker_done(r)

    def _isolated(self, reqs: list[CoreRequest], bucket: int,
                  run: Callable[[list[CoreRequest], int], Sequence[Any]]) -> list[tuple[CoreRequest, Any]]:
        """Run a batched call; if it raises, run each row alone so the failure ends only its own stream.
        (Rows are independent and cache writes idempotent, so re-running the survivors is safe.)"""
        try:
            return list(zip(reqs, run(reqs, bucket), strict=True))
        except Exception as exc:
            if len(reqs) == 1:
                self._fail(reqs[0], exc)
                return []
        out = []
        for r in reqs:
            try:
                out.append((r, run([r], self.scheduler.bucket(1))[0]))
            except Exception as exc:
                self._fail(r, exc)
        return out

    # ---- codec -----------------------------------------------------------------------------------
    def _decode(self, reqs: list[CoreRequest], size: int) -> None:
        """One code2wav chunk of `size` frames for each request, batched, with exact carried state."""
        assert self.pool is not None

        def run(batch: list[CoreRequest], _b: int) -> list[np.ndarray]:
            assert self.pool is not None
            codes = torch.stack([torch.stack(r.codes[:size], dim=1) for r in batch])  # [B, 16, size]
            slots = [r.slot for r in batch]
            state = self.pool.codec.rows(slots)  # type: ignore[arg-type]
            wav = self.model.codec.step(codes, state)
            self.pool.codec.put(slots, state)  # type: ignore[arg-type]
            return list(wav.float().cpu().numpy())

        self.stats["decode_calls"] += 1
        now = self.clock()
        for r, wav in self._isolated(reqs, len(reqs), run):
            try:
                first = r.frames_decoded
                del r.codes[:size]
                r.frames_decoded += size
                rec = r.record
                rec.pending_frames -= size
                rec.chunks_sent += 1
                self._emit(r, wav, first)
                rec.audio_s += size * self.frame_seconds
                if rec.first_audio_at is None:
                    rec.first_audio_at = now
            except Exception as exc:
                self._fail(r, exc)

    def _emit(self, req: CoreRequest, wav: np.ndarray, first_frame: int) -> None:
        if req.resampler is not None:
            pcm = req.resampler.push(wav)
        else:
            pcm = (np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
        self._queue_audio(req, pcm, req.token_segments[min(first_frame, req.n_tokens - 1)])

    def _queue_audio(self, req: CoreRequest, pcm: np.ndarray, segment: int) -> None:
        if pcm.size:
            req.outbox.append(AudioChunk(pcm, req.opts.sample_rate, req.samples_out, segment))
            req.samples_out += pcm.size
            req.last_segment = segment

    # ---- endings ---------------------------------------------------------------------------------
    def _flush_outboxes(self) -> None:
        for req in list(self._requests.values()):
            while req.outbox:
                try:
                    if not req.bridge.put(req.outbox[0], timeout=0):
                        req.outbox.clear()  # the stream ended (cancelled): drop the audio
                        break
                except TimeoutError:
                    break  # the consumer is not reading: keep the chunk, the request stays paused
                req.outbox.popleft()
            if req.ended and not req.outbox and req.rid in self._requests and req.slot is None:
                self._requests.pop(req.rid, None)
                req.bridge.end("done")

    def _maybe_done(self, req: CoreRequest) -> None:
        """A request that made its last frame and decoded it ends; the stream ends with it, or goes on
        in its next request."""
        rec = req.record
        if req.slot is None or rec.generating or rec.pending_frames > 0:
            return
        if req.at_max_frames(self.config.max_frames):  # a benchmark's fixed length: the rest is not spoken
            self._release(req)
            self._complete_stream(req)
            return
        self._pace(req)
        if not self._account(req):
            return
        if req.finished and not self._has_pending(req):
            self._release(req)
            self._complete_stream(req)
            return
        self._next_request(req)

    def _account(self, req: CoreRequest) -> bool:
        """Count the content tokens the talker consumed; put those it did not (the model said EOS before
        reaching them) back in front of the pending text, so no committed text is lost. False: the
        request consumed nothing, and the stream ended with an error (another try would do the same)."""
        k = self._consumed(req)
        new = {s for s in req.token_segments[:k] if s > req.fed_last}
        req.fed_tokens += k
        req.fed_segments += len(new)
        req.fed_last = max(new, default=req.fed_last)
        if k == len(req.ids):
            return True
        if k == 0:
            self._fail(req, RuntimeError("the model ended its request before speaking any of its text"))
            return False
        groups: list[tuple[int, list[int]]] = []
        for seg, tok in zip(req.token_segments[k:], req.ids[k:], strict=True):
            if groups and groups[-1][0] == seg:
                groups[-1][1].append(tok)
            else:
                groups.append((seg, [tok]))
        # A space after each: it becomes the carry before the piece that follows, as appended text has.
        back = [(seg, self.model.tokenizer.decode(ids) + " ") for seg, ids in groups]
        req.pending_text.extendleft(reversed(back))
        req.ledger.taken -= sum(len(text) for _, text in back)
        return True

    def _consumed(self, req: CoreRequest) -> int:
        """Content tokens of the current request the talker has consumed (the prompt's included)."""
        rows = req.frames if req.ended_by_eos else max(req.frames - 1, 0)  # text rows fed to a step
        return max(0, min(rows + req.track_offset, len(req.ids)))

    def _next_request(self, req: CoreRequest) -> None:
        """The stream goes on: free the slot (the decoder state kept for the next request), reset the
        request's state; the next one is admitted when its text is there and a slot is free. One that
        gave its slot up to a waiting stream queues behind it; one that only reached the end of its KV
        context continues first."""
        assert self.pool is not None and req.slot is not None
        rec = req.record
        if not req.opts.codec_tokens:  # (a codec_tokens listener's decoder goes on by itself)
            req.codec_carry = self.pool.codec.rows([req.slot])
        evicted = rec.evicting
        self._release(req)
        req.frames_before += req.frames
        req.frames = req.frames_decoded = 0
        req.codes.clear()
        req.track = req.pad_row = None
        req.ids, req.token_segments = [], []
        req.eos_fed = req.ended_by_eos = False
        rec.pending_frames = 0
        rec.to(Status.RESUMING if not evicted and self._has_pending(req) else Status.WAITING)
        if not rec.resume:
            rec.arrival = self.clock()  # behind the streams already waiting
            rec.chunks_sent = 0  # its listener has run dry meanwhile: small chunks first again
        rec.has_text = self._can_admit(req)

    def _complete_stream(self, req: CoreRequest) -> None:
        """The stream's last request is done: its audio drains from the outbox, then it ends "done"."""
        if req.resampler is not None:  # the filter's tail: the last few ms of the utterance
            self._queue_audio(req, req.resampler.flush(), req.last_segment)
        self.finished_frames[req.rid] = req.frames_before + req.frames
        self.finished_text[req.rid] = (req.requests, req.fed_segments, req.fed_tokens)
        for done in (self.finished_frames, self.finished_text):
            if len(done) > 4096:  # a long-running server keeps only recent ones
                del done[next(iter(done))]
        req.record.to(Status.ENDED)  # the outbox drains in _flush_outboxes, then the stream ends "done"

    def _release(self, req: CoreRequest) -> None:
        """Free the request's slot: the talker's state (abort) and the core's. The caller moves the
        status on (to the stream's next request, or its end)."""
        if req.slot is not None:
            assert self.pool is not None and self.talker is not None
            slot, req.slot = req.slot, None
            try:
                self.talker.abort(slot)
            finally:
                self.pool.release(slot)

    def _talker_done(self, req: CoreRequest) -> None:
        """The talker owes the request no more frames (EOS, frame cap): its last frames decode."""
        req.record.to(Status.EVICTED if req.record.status is Status.EVICTING else Status.DRAINING)

    def _end(self, req: CoreRequest, reason: str, message: str = "") -> None:
        self._release(req)
        if not req.ended:
            req.record.to(Status.ENDED)
        req.outbox.clear()
        self._requests.pop(req.rid, None)
        req.bridge.end(reason, message)

    def _unspoken(self, req: CoreRequest) -> str:
        """The committed text a failing stream leaves unspoken (for its error message)."""
        with contextlib.suppress(Exception):
            start = self._consumed(req) if req.frames else 0  # no frame yet: none of it was voiced
            taken = self.model.tokenizer.decode(req.ids[start:]) if req.ids else ""
            return quote_text(taken + "".join(text for _, text in req.pending_text))
        return "(unknown)"

    def _fail(self, req: CoreRequest, exc: BaseException) -> None:
        log.warning("stream %d failed: %s: %s", req.rid, type(exc).__name__, exc)
        with contextlib.suppress(Exception):
            unspoken = self._unspoken(req)
            self._end(req, "error", f"{type(exc).__name__}: {exc}" + (f"; unspoken text: {unspoken}"
                                                                     if unspoken else ""))
