"""EngineCore: the one thread that owns every tensor of the Qwen3 engine, so none is touched by two (docs/engine.md).

Other threads only post commands (`Open`, `Append`, `Finish`, `Cancel`, `Stop`) to a queue; the core
drains it at the top of every cycle, so a cancel takes effect before the next step. A cycle reads as
vLLM's engine core: `plan = scheduler.plan(records, now)` → `execute(plan)` (≤1 prefill, one batched
talker step, one batched code-predictor pass) → `update(plan, results)` (code2wav chunks batched by
size, endings). The scheduler's records are written by one function (`_records`); a record's status
moves only along engine/qwen3/serving/scheduler.py `TRANSITIONS`. The talker is a `TalkerBackend`: the core hands it
slot ids and rows and gets codebook-0 ids and frames back; the core keeps each slot's codec state.
Streams, requests and their lifecycle: docs/engine.md ("The Qwen3 core").
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.qwen3.model import Qwen3TTSModel
from engine.qwen3.serving.core_stream import (
    Append,
    Cancel,
    ClonedVoice,
    Command,
    CoreConfig,
    CoreStats,
    CoreStream,
    Finish,
    Open,
    Stop,
    StreamOptions,
    TalkerRequest,
    TextLedger,
    deliver,
    isolated,
    make_voice,
    open_stream,
    prompt_rows,
)
from engine.qwen3.serving.scheduler import (
    RequestRecord,
    Scheduler,
    SchedulerConfig,
    Status,
    StepPlan,
    ThroughputMeter,
    bucket_sizes,
)
from engine.qwen3.serving.slots import SlotPool
from engine.qwen3.serving.talker_backend import TalkerBackend, TalkerFactory, TalkerSpec, talker_factory
from engine.qwen3.serving.text_track import Pace, TextTrack, TrackLimits
from engine.reference import VoiceMaker
from engine.stream import EventBridge
from engine.types import CodecFrames

__all__ = ["CoreConfig", "CoreStats", "EngineCore", "StreamOptions", "TextLedger"]

log = logging.getLogger("voxgate.engine.core")

@dataclass(frozen=True, slots=True)
class StepResults:
    produced: list[CoreStream]  # streams whose request made a frame this cycle
    rows: int  # the rows this cycle's time is charged to
    worked: bool


class EngineCore:
    """The engine thread. Thread-safe entry points: `submit`, `append`, `finish`, `cancel`, `stop`."""

    def __init__(self, model: Qwen3TTSModel, config: CoreConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, talker: str | TalkerFactory = "native",
                 talker_options: dict[str, Any] | None = None) -> None:
        """`talker`: a registered name (engine/qwen3/serving/talker_backend.py `TALKERS`) or a factory, built on this
        core's thread; `talker_options` go to it as `TalkerSpec.options`."""
        config = config if config is not None else CoreConfig()
        self.model, self.config, self.clock = model, config, clock
        self._talker_factory = talker_factory(talker)
        self._talker_options = dict(talker_options or {})
        self.frame_seconds = model.samples_per_frame / model.sample_rate
        self._buckets = bucket_sizes(config.max_batch, min_bucket=config.min_bucket)
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch=config.max_batch, buckets=self._buckets, ramp=config.ramp,
            max_codec_rows=config.max_codec_rows, low_water_s=config.low_water_s, defer_s=config.defer_s,
            first_hold_s=config.first_hold_s, frames_per_s=1.0 / self.frame_seconds,
        ))
        self.track = TextTrack(model.tokenizer, TrackLimits(
            config.max_context, config.min_frames, config.frames_per_token,
            hold_more_frames=config.hold_more_s / self.frame_seconds), lambda s: prompt_rows(model, s))
        self.pace = Pace()  # frames per text row: what a stream's text is expected to take
        self.stats = CoreStats()
        self.meter = ThroughputMeter(self._buckets)  # frames per stream per second at each batch bucket
        self._commands: deque[Command] = deque()
        self._wake = threading.Event()
        self._ids = itertools.count(1)
        self._streams: dict[int, CoreStream] = {}
        self._stopping = False
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.pool: SlotPool | None = None  # slot ids and codec state: the core's side of the slots
        self.talker: TalkerBackend | None = None  # the talker, with its own side of the slots
        self.voices: VoiceMaker[ClonedVoice] = VoiceMaker(lambda *a: make_voice(model, *a), on_done=self._wake.set)
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
        return len(self._streams)

    def _post(self, cmd: Command) -> None:
        self._commands.append(cmd)  # deque.append is atomic: no lock on the caller's side
        self._wake.set()

    # ---- the thread ------------------------------------------------------------------------------
    def _start(self) -> None:
        # Intra-op threads of this thread's torch work: set here, deliberately, not inherited.
        torch.set_num_threads(self.config.threads)
        t0, cfg = time.perf_counter(), self.config
        self.pool = SlotPool.allocate(self.model, cfg.max_streams)
        self.talker = self._talker_factory(self.model, TalkerSpec(
            cfg.max_streams, cfg.max_context, self._buckets, kv_block=cfg.kv_block, cuda_graphs=cfg.cuda_graphs,
            options=self._talker_options))
        if (self.talker.max_slots, self.talker.max_context) != (cfg.max_streams, cfg.max_context):
            raise ValueError(f"the talker holds {self.talker.max_slots} slots × {self.talker.max_context} "
                             f"positions; the core needs {cfg.max_streams} × {cfg.max_context}")
        if cfg.warm_up:
            self.meter.set_step_costs(self.talker.warm_up(self._buckets))
            state = self.model.codec.new_state(1)
            for n in sorted(set(cfg.ramp)):
                self.model.codec.step(torch.zeros(1, 16, n, dtype=torch.long, device=self.model.device), state)
        per_slot = self.bytes_per_slot()
        log.info("Qwen3 engine core: %d slots × %d positions, %d bytes per slot (%s), buckets %s, "
                 "%d threads, ready in %.2f s", cfg.max_streams, cfg.max_context, sum(per_slot.values()),
                 per_slot, self._buckets, cfg.threads, time.perf_counter() - t0)

    def _main(self) -> None:
        try:
            self._start()
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
                    self.stats.cycle_s.append(dt)
                    self.stats.cpu_s += time.thread_time() - c0
                    self.meter.record(self.stats.batch_rows, self.stats.batch_frames, dt)
                else:  # a paused stream waits for its consumer, which signals nothing: poll it briefly
                    self._wake.wait(0.005 if any(s.outbox for s in self._streams.values()) else 0.5)
                    self._wake.clear()
        for s in list(self._streams.values()):
            self._end(s, "error", "the engine was closed")
        self.voices.close()
        if self.talker is not None:
            with contextlib.suppress(Exception):
                self.talker.close()

    def _cycle(self) -> bool:
        """One step: take commands in, plan from the records, execute the plan, update from the results."""
        self._intake()
        assert self.pool is not None
        now = self.clock()
        plan = self.scheduler.plan(self._records(now), now, self.pool.available)
        results = self._execute(plan)
        worked = self._update(plan, results)
        self.stats.cycles += 1
        return worked

    # ---- commands --------------------------------------------------------------------------------
    def _intake(self) -> None:
        """Commands in order; then audio out to consumers, and cloned voices that are ready."""
        while self._commands:
            cmd = self._commands.popleft()
            if isinstance(cmd, Stop):
                self._stopping = True
            elif isinstance(cmd, Open):
                self._streams[cmd.rid] = open_stream(cmd, self.clock(), self.model.sample_rate, self.voices)
            elif (s := self._streams.get(cmd.rid)) is not None and not s.ended:  # else: it has ended
                try:
                    self._command(s, cmd)
                except Exception as exc:
                    self._fail(s, exc)
        deliver(self._streams)
        for s in list(self._streams.values()):
            if isinstance(s.voice, Future) and s.voice.done() and not s.ended:
                try:
                    s.voice = s.voice.result()
                except Exception as exc:
                    self._fail(s, exc)

    def _command(self, s: CoreStream, cmd: Append | Finish | Cancel) -> None:
        match cmd:
            case Append(text=text):
                self._on_append(s, text)
            case Finish():
                s.finished = True
                # With text pending, its request ends at a boundary already: the last one gets the end of text.
                if s.talk is not None and not self.track.has_pending(s):
                    s.talk.feed_eos(self.model.prompts)
                elif s.talk is None and not self.track.has_pending(s):
                    self._complete_stream(s)  # nothing (more) to say
            case Cancel(at=at):
                self._release(s)
                s.record.to(Status.ENDED)
                self._streams.pop(s.rid, None)
                self.stats.cancel_latency_s.append(time.perf_counter() - at)

    def _on_append(self, s: CoreStream, text: str) -> None:
        seg = s.segments
        s.segments += 1
        if s.finished:
            raise RuntimeError("append after finish")
        talk = s.talk
        if talk is None or talk.eos_fed:  # for the next request
            s.pending_text.append((seg, text))
            return
        ids, carry = self.track.piece_ids(s.carry, text)
        if ids and len(talk.ids) + len(ids) > self.track.budget(s):
            # The piece would not fit this request's KV context: the request ends here, at the segment
            # boundary, and the next one starts with this piece.
            s.pending_text.append((seg, text))
            talk.feed_eos(self.model.prompts)
            return
        s.carry = carry
        s.ledger.taken += len(text)
        if ids:
            assert talk.track is not None
            talk.track = torch.cat([talk.track, self.model.prompts.text_rows(ids)])
            talk.ids += ids
            talk.token_segments += [seg] * len(ids)

    # ---- the scheduler's view --------------------------------------------------------------------
    def _records(self, now: float, planning: bool = True) -> list[RequestRecord]:
        """The one place the records' facts are written, from the streams, for every live stream. When
        `planning` (the top of a cycle) a request whose track ran dry parks here (and resumes when text
        came) and the facts the talker plan reads are taken; after the talker ran (`planning` False) only
        what it changed: frames made, audio out. The codec plan thus sees the cycle's new frames and the
        same hold estimate the talker plan saw."""
        out = []
        for s in self._streams.values():
            rec, talk = s.record, s.talk
            if rec.ended:
                continue
            if planning:
                if rec.status in (Status.RUNNING, Status.PARKED):
                    assert talk is not None
                    if (talk.next_text_row() is None) != rec.parked:
                        rec.to(Status.RUNNING if rec.parked else Status.PARKED, now)
                rec.has_text = self.track.can_admit(s)
                rec.paused = bool(s.outbox)
                rec.arrival, rec.before, rec.chunks_sent = s.arrival, s.before, s.chunks_sent
                if s.first_audio_at is None and talk is not None and talk.slot is not None:
                    rec.frames_left = self.track.frames_left(s, self.pace.frames_per_row)
            rec.audio_s, rec.first_audio_at, rec.first_frame_at = s.audio_s, s.first_audio_at, s.first_frame_at
            rec.pending_frames = len(talk.codes) if talk is not None else 0
            out.append(rec)
        return out

    # ---- execute: the talker ---------------------------------------------------------------------
    def _execute(self, plan: StepPlan) -> StepResults:
        """Evictions, the waiting notices, at most one prefill, one batched talker step, and one batched
        code-predictor pass for every row that produced codebook 0."""
        for rid in plan.evict:  # a parked request gives its slot to a stream waiting for one (docs/engine.md)
            s = self._streams[rid]
            log.info("stream %d: parked %.1f s while a stream waits for a slot: it ends its request and "
                     "resumes in a new one", rid, self.clock() - (s.record.parked_since or self.clock()))
            assert s.talk is not None
            s.talk.feed_eos(self.model.prompts)  # it speaks what it has to its end, then frees the slot
            s.record.to(Status.EVICTING)
            self.stats.evictions += 1
        talker = plan.talker
        for rid, ahead in talker.blocked:
            self._streams[rid].tell_waiting(ahead)
        # The rows this cycle's time is charged to: those planned, or in a decode-only cycle the streams
        # holding a slot (their decodes are what it spends its time on).
        rows = len(talker.step) + (talker.prefill is not None) or sum(
            1 for s in self._streams.values() if not s.ended and s.slot is not None)
        produced: list[CoreStream] = []
        if talker.prefill is not None and self._admit(self._streams[talker.prefill]):
            produced.append(self._streams[talker.prefill])
        if talker.step:
            produced += self._talk([self._streams[rid] for rid in talker.step], talker.bucket)
        if produced:
            self._complete(produced, self.scheduler.bucket(len(produced)))
        return StepResults(produced, rows, talker.prefill is not None or bool(talker.step))

    def _admit(self, s: CoreStream) -> bool:
        """Start the stream's next request: take the pending text that fits one request, build its prompt
        and prefill it into a free slot. The request is closed (its end of text fed) when text is left
        for the next one, at `finish()`, and for an ICL clone whose text does not cover the reference.
        True when it produced codebook 0 of its first frame."""
        assert self.pool is not None and self.talker is not None
        try:
            budget = self.track.budget(s)
            if budget < 1:
                raise ValueError(f"this voice's prompt takes {self.track.prompt_rows(s)} of the "
                                 f"{self.config.max_context} KV positions: no room left for text")
            ids, segments = self.track.take(s, budget)
            talk = s.talk = TalkerRequest(ids=ids, token_segments=segments)  # (a failure from here names them)
            covers = True
            if s.icl:
                assert isinstance(s.voice, ClonedVoice) and s.voice.clone.ref_codes is not None
                ref, n_ref = len(s.voice.ref_ids), s.voice.clone.ref_codes.shape[0] + 1
                covers = ref + len(ids) >= n_ref
                # The prompt sums the first n_ref rows of transcript ++ text with the reference frames;
                # the rest (transcript tokens first, if it is longer) rides the track.
                talk.extra_rows = max(0, ref - n_ref)
                talk.track_offset = max(0, min(ref + len(ids), n_ref) - ref) - talk.extra_rows
            else:
                talk.track_offset = 1
            closed = self.track.has_pending(s) or s.finished or not covers
            prompt = self.model.build_prompt(ids, voice=s.voice_arg, language=s.opts.language,
                                             instructions=s.opts.instructions, streaming_text=True, final=closed)
            talk.track, talk.pad_row, talk.prompt_len = prompt.trailing, prompt.pad, prompt.rows.shape[0]
            talk.eos_fed = closed
            talk.slot = self.pool.acquire()
            s.requests += 1
            s.record.to(Status.RUNNING)
            s.waiting_told = False
            self._carry_codec(s, talk.slot)
            self.stats.prefills += 1
            cb0 = self.talker.prefill(talk.slot, prompt.rows, s.opts.params)
        except Exception as exc:
            self._fail(s, exc)
            return False
        if cb0 == self.talker.eos_id:
            talk.ended_by_eos = True
            s.talker_done()
            return False
        return True

    def _carry_codec(self, s: CoreStream, slot: int) -> None:
        """The slot's codec state goes on from the stream's last request, or from an ICL reference."""
        assert self.pool is not None
        if s.codec_carry is not None:  # the audio of the stream's last request goes on
            self.pool.codec.put([slot], s.codec_carry)
            s.codec_carry = None
        elif s.requests == 1 and isinstance(s.voice, ClonedVoice) and s.voice.primed is not None:
            self.pool.codec.put([slot], s.voice.primed)  # continue the reference
            if s.opts.codec_tokens:  # the listener's decoder continues it too
                ref_codes = s.voice.clone.ref_codes
                assert ref_codes is not None
                s.outbox.append(CodecFrames(ref_codes.to(torch.int16).numpy(), -ref_codes.shape[0], 0, prime=True))

    def _talk(self, streams: list[CoreStream], bucket: int) -> list[CoreStream]:
        """One batched talker step; returns the streams whose request produced codebook 0 (not EOS)."""
        talker = self.talker
        assert talker is not None

        def run(batch: list[CoreStream], b: int) -> list[int]:
            rows = []
            for s in batch:
                assert s.talk is not None
                row = s.talk.next_text_row()
                assert row is not None  # the scheduler never plans a parked request
                rows.append(row)
            return talker.step([s.slot for s in batch], torch.stack(rows),  # type: ignore[misc]
                               [s.opts.params for s in batch], b)

        out = []
        for s, cb0 in isolated(streams, bucket, self.scheduler.bucket(1), self._fail, run):
            self.stats.talker_rows += 1
            if cb0 == talker.eos_id:
                assert s.talk is not None
                s.talk.ended_by_eos = True
                s.talker_done()
            else:
                out.append(s)
        return out

    def _complete(self, streams: list[CoreStream], bucket: int) -> None:
        """The code predictor for every row that produced codebook 0 this cycle, in one pass."""
        talker = self.talker
        assert talker is not None

        def run(batch: list[CoreStream], b: int) -> list[torch.Tensor]:
            return list(talker.complete([s.slot for s in batch], [s.opts.params for s in batch], b))  # type: ignore[misc]

        now = self.clock()
        for s, frame in isolated(streams, bucket, self.scheduler.bucket(1), self._fail, run):
            talk = s.talk
            assert talk is not None
            if s.opts.codec_tokens:  # the frame leaves as it is: its listener decodes it
                segment = talk.segment_of(talk.frames)
                s.outbox.append(CodecFrames(frame.to(torch.int16).cpu().numpy()[None], s.frames, segment))
                s.last_segment = segment
                s.audio_s += self.frame_seconds
                s.first_audio_at = now if s.first_audio_at is None else s.first_audio_at
            else:
                talk.codes.append(frame)
                s.first_frame_at = now if s.first_frame_at is None else s.first_frame_at
            talk.frames += 1
            self.stats.frames += 1
            if talk.frames >= self.track.frame_cap(talk) or s.at_max_frames(self.config.max_frames):
                s.talker_done()

    # ---- update: the codec and the endings -------------------------------------------------------
    def _update(self, plan: StepPlan, results: StepResults) -> bool:
        """Decode the chunks that are due, end the requests that are done, hand audio out."""
        self.stats.batch_rows, self.stats.batch_frames = results.rows, len(results.produced)
        now = self.clock()
        records = self._records(now, planning=False)
        # The slowest recent cycle, not the typical one: a listener runs dry in the slow ones.
        cycle_s = max(itertools.islice(reversed(self.stats.cycle_s), 8), default=0.0)
        generating = sum(1 for r in records if r.generating)
        rate = self.meter.stream_rate(self.meter.bucket(generating)) if generating else None
        codec = self.scheduler.plan_codec(records, now, plan.talker.pressing, cycle_s, rate)
        batches = codec.batches(self.config.max_codec_rows)
        for size, rids in batches:
            self._decode([self._streams[rid] for rid in rids], size)
        for s in list(self._streams.values()):
            if not s.ended:
                self._maybe_done(s)
        deliver(self._streams)
        return results.worked or bool(batches)

    def _decode(self, streams: list[CoreStream], size: int) -> None:
        """One code2wav chunk of `size` frames for each stream, batched, with exact carried state."""
        pool = self.pool
        assert pool is not None

        def run(batch: list[CoreStream], _b: int) -> list[np.ndarray]:
            codes = torch.stack([torch.stack(s.talk.codes[:size], dim=1) for s in batch])  # type: ignore[union-attr]
            slots: list[int] = [s.slot for s in batch]  # type: ignore[misc]
            state = pool.codec.rows(slots)
            wav = self.model.codec.step(codes, state)  # [B, 16, size] → [B, samples]
            pool.codec.put(slots, state)
            return list(wav.float().cpu().numpy())

        self.stats.decode_calls += 1
        now = self.clock()
        for s, wav in isolated(streams, len(streams), len(streams), self._fail, run):
            talk = s.talk
            assert talk is not None
            try:
                first = talk.frames_decoded
                del talk.codes[:size]
                talk.frames_decoded += size
                s.chunks_sent += 1
                s.queue_wav(wav, talk.segment_of(first))
                s.audio_s += size * self.frame_seconds
                s.first_audio_at = now if s.first_audio_at is None else s.first_audio_at
            except Exception as exc:
                self._fail(s, exc)

    # ---- endings ---------------------------------------------------------------------------------
    def _maybe_done(self, s: CoreStream) -> None:
        """A request that made its last frame and decoded it ends; the stream ends with it, or goes on in
        its next request."""
        talk, rec = s.talk, s.record
        if talk is None or talk.slot is None or rec.generating or talk.codes:
            return
        if not s.at_max_frames(self.config.max_frames):  # (a benchmark's fixed length: the rest is not spoken)
            self.pace.observe(talk)
            if self.track.account(s) == 0 and talk.ids:
                self._fail(s, RuntimeError("the model ended its request before speaking any of its text"))
                return
            if not s.finished or self.track.has_pending(s):
                self._next_request(s)
                return
        self._release(s)
        self._complete_stream(s)

    def _next_request(self, s: CoreStream) -> None:
        """The stream goes on: free the slot (the decoder state kept for the next request); the next one
        is admitted when its text is there and a slot is free. One that gave its slot up to a waiting
        stream queues behind it; one that only reached the end of its KV context continues first."""
        assert self.pool is not None and s.slot is not None
        rec = s.record
        if not s.opts.codec_tokens:  # (a codec_tokens listener's decoder goes on by itself)
            s.codec_carry = self.pool.codec.rows([s.slot])
        evicted = rec.evicting
        self._release(s)
        rec.to(Status.RESUMING if not evicted and self.track.has_pending(s) else Status.WAITING)
        if not rec.resume:
            s.arrival = self.clock()  # behind the streams already waiting
            s.chunks_sent = 0  # its listener has run dry meanwhile: small chunks first again

    def _complete_stream(self, s: CoreStream) -> None:
        """The stream's last request is done: its audio drains from the outbox, then it ends "done"."""
        if s.resampler is not None:  # the filter's tail: the last few ms of the utterance
            s.queue_pcm(s.resampler.flush(), s.last_segment)
        self.stats.finished(s)
        s.record.to(Status.ENDED)  # the outbox drains in `deliver`, then the stream ends "done"

    def _release(self, s: CoreStream) -> None:
        """Drop the stream's request and free its slot: the talker's state (abort) and the core's. The
        caller moves the status on (to the stream's next request, or its end)."""
        talk, s.talk = s.talk, None
        if talk is None:
            return
        s.frames_before += talk.frames
        if talk.slot is not None:
            assert self.pool is not None and self.talker is not None
            try:
                self.talker.abort(talk.slot)
            finally:
                self.pool.release(talk.slot)

    def _end(self, s: CoreStream, reason: str, message: str = "") -> None:
        self._release(s)
        if not s.ended:
            s.record.to(Status.ENDED)
        s.outbox.clear()
        self._streams.pop(s.rid, None)
        s.bridge.end(reason, message)

    def _fail(self, s: CoreStream, exc: BaseException) -> None:
        log.warning("stream %d failed: %s: %s", s.rid, type(exc).__name__, exc)
        with contextlib.suppress(Exception):
            unspoken = self.track.unspoken(s)
            self._end(s, "error", f"{type(exc).__name__}: {exc}" + (f"; unspoken text: {unspoken}"
                                                                  if unspoken else ""))
