"""The scheduling policy of the Qwen3 engine core: which request to admit, which rows to step, which
streams to decode, decided from plain request records and a clock (vLLM v1's split: this module
decides, engine/qwen3/serving/core.py executes). No torch here, so every rule is tested with a fake clock.

Urgency is the listener's point of view, on its timeline (`ListenerTimeline`, engine/listening.py,
the one both engines read). A stream with no audio yet is waiting on its first audio (time to first
audio), the most urgent kind. A stream with audio has a simulated client player that starts at its
first audio (`RequestRecord.timeline`): it runs out `audio_s` after it, and the listener who runs dry
first is the most urgent; one whose `dry_at` is past is already hearing a gap.

A stream's first audio is held while it is made slower than it plays and the rest of its text would
come after its listener needs it (`Scheduler.holds_first`): a later start instead of a gap.

Capacity: a stream that has text but no slot waits in line (`TalkerPlan.blocked`, so the core can tell
it why its audio is late), and a parked stream (admitted, its text track ran dry before `finish()`)
that has waited `park_evict_s` gives its slot up to it (`plan_evictions`): an idle socket must not
hold engine capacity that a talking one needs.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from engine.listening import HoldRule, ListenerTimeline, holds_first

#: First code2wav chunk small (time to first audio), then larger ones (a decode has a fixed cost).
DEFAULT_RAMP = (2, 4, 8, 16, 25)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)
#: Codec frames a stream's listener consumes per second (Qwen3-TTS's 12 Hz tokenizer: 12.5 frames/s).
FRAMES_PER_S = 12.5
#: Measured throughput promised to listeners: a stream is counted only if it gets 1.25× real time.
HEADROOM = 1.25


class Status(Enum):
    """Where a stream's current request is. One value, changed only through `RequestRecord.to`, which
    asserts the move is one of `TRANSITIONS`."""

    WAITING = "waiting"  # no slot: waits for text, its cloned voice, or a free slot (in line with text)
    RESUMING = "resuming"  # no slot: its last request reached its frame cap with text left: first in line
    RUNNING = "running"  # holds a slot; the talker owes frames and its text track has the next row
    PARKED = "parked"  # holds a slot; its text track ran dry before finish(): skipped, not fed padding
    EVICTING = "evicting"  # holds a slot; parked too long, its end of text fed early so it frees the
    # slot for a stream waiting in line; the talker still owes frames
    DRAINING = "draining"  # holds a slot; the talker is done (EOS or frame cap), its last frames decode
    EVICTED = "evicted"  # holds a slot; the talker is done after EVICTING, its last frames decode
    ENDED = "ended"  # the stream ended (done, cancelled, failed); its last audio may still drain


#: The moves a request may make. Every status may end (cancel, failure, engine stop).
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WAITING: frozenset({Status.RUNNING, Status.ENDED}),
    Status.RESUMING: frozenset({Status.RUNNING, Status.ENDED}),
    Status.RUNNING: frozenset({Status.PARKED, Status.DRAINING, Status.ENDED}),
    Status.PARKED: frozenset({Status.RUNNING, Status.EVICTING, Status.ENDED}),
    Status.EVICTING: frozenset({Status.EVICTED, Status.ENDED}),
    Status.DRAINING: frozenset({Status.WAITING, Status.RESUMING, Status.ENDED}),
    Status.EVICTED: frozenset({Status.WAITING, Status.ENDED}),
    Status.ENDED: frozenset(),
}
_ADMITTED = frozenset({Status.RUNNING, Status.PARKED, Status.EVICTING, Status.DRAINING, Status.EVICTED})
_GENERATING = frozenset({Status.RUNNING, Status.PARKED, Status.EVICTING})


@dataclass(slots=True)
class RequestRecord:
    """What the policy knows of one request; the core keeps it current. Its lifecycle is `status`
    (moved with `to`); `has_text` and `paused` are facts the core refreshes."""

    rid: int
    # clock time the stream was opened (ties among streams without audio); the core moves it to the
    # time an evicted stream queues again, so it waits in line behind those that were already waiting
    arrival: float
    has_text: bool = False  # some committed text (a prompt can be built)
    status: Status = Status.WAITING
    parked_since: float | None = None  # clock time it parked (None: not PARKED); set by `to`
    paused: bool = False  # its consumer is not reading (outgoing queue full): do not advance it
    pending_frames: int = 0  # frames generated but not yet decoded to audio
    chunks_sent: int = 0  # code2wav chunks decoded so far (position on the ramp)
    audio_s: float = 0.0  # seconds of audio handed to the consumer
    first_audio_at: float | None = None  # clock time of the first audio
    # Before the first audio (the first-audio hold, `Scheduler.holds_first`): when its first frame was
    # made, and the frames its known text is expected to take past those made (the core's estimate).
    first_frame_at: float | None = None
    frames_left: float = 0.0
    before: ListenerTimeline | None = None  # a continuation: its listener's timeline of the audio before it
    # `timeline`'s last answer: it changes only when audio goes out, and the rules read it several
    # times a cycle for every stream
    _heard: ListenerTimeline | None = field(default=None, init=False, repr=False, compare=False)

    def to(self, status: Status, now: float | None = None) -> None:
        """Move to `status` (AssertionError for a move `TRANSITIONS` does not allow); parking records
        `now` as `parked_since`."""
        assert status in TRANSITIONS[self.status], f"request {self.rid}: {self.status.name} → {status.name}"
        self.status = status
        self.parked_since = now if status is Status.PARKED else None

    @property
    def admitted(self) -> bool:
        """Owns a slot and was prefilled."""
        return self.status in _ADMITTED

    @property
    def generating(self) -> bool:
        """The talker still owes frames (no EOS, under the frame cap)."""
        return self.status in _GENERATING

    @property
    def parked(self) -> bool:
        return self.status is Status.PARKED

    @property
    def evicting(self) -> bool:
        """Its request is closing to give its slot to a waiting stream (until the slot is free)."""
        return self.status in (Status.EVICTING, Status.EVICTED)

    @property
    def resume(self) -> bool:
        """It gave its slot up at the frame cap and continues now: first in line."""
        return self.status is Status.RESUMING

    @property
    def ended(self) -> bool:
        return self.status is Status.ENDED

    @property
    def timeline(self) -> ListenerTimeline | None:
        """Its listener's timeline of the audio sent: a simulated client player that starts at the first
        audio runs out `audio_s` after it (None before the first audio: nothing is playing)."""
        if self.first_audio_at is None:
            return None
        runs_out_at = self.first_audio_at + self.audio_s
        heard = self._heard
        if heard is None or heard.runs_out_at != runs_out_at:
            heard = self._heard = ListenerTimeline(runs_out_at)
        return heard


def urgency(rec: RequestRecord) -> tuple[int, float]:
    """Sort key, most urgent first: no audio yet (oldest first), then the listener who runs dry first."""
    heard = rec.timeline
    if heard is None:
        return (0, rec.arrival)
    return (1, heard.dry_at)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_batch: int = 32  # most talker rows per step (the prefill row included)
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    ramp: tuple[int, ...] = DEFAULT_RAMP
    max_codec_rows: int = 32  # most streams per batched decode; a cycle decodes that many full chunks' frames
    low_water_s: float = 1.0  # s: a listener with less than this ahead is pressing (VoxServe's rule)
    defer_s: float = 2.0  # s: a chunk of a stream whose listener has more ahead can wait for pressing talker work
    # s: a partial chunk decodes once its listener runs dry within 2 cycles + this (the decode must start by then)
    flush_margin_s: float = 0.05
    park_evict_s: float = 1.0  # a request parked this long gives its slot to a stream waiting for one
    frames_per_s: float = FRAMES_PER_S  # frames a listener plays per second
    # The first-audio hold (`Scheduler.holds_first`): at most this long past a stream's first frame, and
    # the measured frame rate taken to be this much too fast (a cycle's cost moves with its company).
    first_hold_s: float = 2.0
    hold_error: float = 0.15

    def __post_init__(self) -> None:
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive sizes, got {self.buckets}")
        if self.max_batch > self.buckets[-1]:
            raise ValueError(f"max_batch {self.max_batch} exceeds the largest bucket {self.buckets[-1]}")
        if not self.ramp or min(self.ramp) < 1:
            raise ValueError(f"the chunk ramp needs positive sizes, got {self.ramp}")
        # Seconds ahead of a listener are never negative (`ListenerTimeline.ahead_s`): a bound at or below
        # zero would never be crossed, and a margin below zero would decode after the listener ran dry.
        if not (self.low_water_s > 0 and self.defer_s >= 0 and self.flush_margin_s >= 0):
            raise ValueError(f"need low_water_s > 0, defer_s >= 0 and flush_margin_s >= 0, got {self.low_water_s}, "
                             f"{self.defer_s}, {self.flush_margin_s}")


@dataclass(frozen=True, slots=True)
class TalkerPlan:
    prefill: int | None  # the request to admit this cycle (at most one)
    step: tuple[int, ...]  # admitted requests to advance by one frame, most urgent first
    bucket: int  # padded batch size of the code-predictor pass (step rows + prefill row)
    pressing: bool  # some planned row belongs to a stream without audio or under the low-water mark
    # (request, streams ahead of it in line) for each stream with text that no free slot is left for
    blocked: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One cycle's talker work: parked requests to close for waiting streams, then the talker plan."""

    evict: tuple[int, ...]
    talker: TalkerPlan


@dataclass(frozen=True, slots=True)
class CodecPlan:
    chunks: tuple[tuple[int, int], ...]  # (request, frames to decode), most urgent first

    def batches(self, max_rows: int) -> list[tuple[int, list[int]]]:
        """(chunk size, requests): one batched decode each, with a static shape and at most `max_rows`
        requests, in the order of their most urgent request."""
        groups: dict[int, list[int]] = {}
        for rid, n in self.chunks:
            groups.setdefault(n, []).append(rid)
        return [(n, rids[i:i + max_rows]) for n, rids in groups.items() for i in range(0, len(rids), max_rows)]


@dataclass
class Scheduler:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)

    def bucket(self, rows: int) -> int:
        """The smallest bucket that holds `rows` (0 rows: 0, nothing runs)."""
        if rows <= 0:
            return 0
        i = bisect.bisect_left(self.config.buckets, rows)
        if i == len(self.config.buckets):
            raise ValueError(f"{rows} rows exceed the largest bucket {self.config.buckets[-1]}")
        return self.config.buckets[i]

    def chunk_size(self, rec: RequestRecord) -> int:
        ramp = self.config.ramp
        return ramp[min(rec.chunks_sent, len(ramp) - 1)]

    @staticmethod
    def line(records: Iterable[RequestRecord]) -> list[RequestRecord]:
        """Streams with text waiting for a slot, in the order they get one: a stream continuing at its
        frame cap first (its listener is hearing it), then first come, first served."""
        waiting = [r for r in records if not r.admitted and r.has_text]
        return sorted(waiting, key=lambda r: (not r.resume, r.arrival, r.rid))

    def plan(self, records: Iterable[RequestRecord], now: float, free_slots: int) -> StepPlan:
        """The talker's work of one cycle: the evictions (`plan_evictions`), and the talker plan with the
        evicted requests runnable (their end of text is fed before the step)."""
        recs = list(records)
        evict = self.plan_evictions(recs, now, free_slots)
        return StepPlan(evict, self.plan_talker(recs, now, free_slots, frozenset(evict)))

    def plan_talker(self, records: Iterable[RequestRecord], now: float, free_slots: int,
                    evicting: frozenset[int] = frozenset()) -> TalkerPlan:
        """Admit at most one prefill (a long prompt must not stall every running stream twice in a
        cycle), then fill the batch with runnable rows in urgency order. Parked and paused requests
        are skipped: the one has no input to consume, the other has nowhere to put its audio; a parked
        one in `evicting` runs (its end of text is fed this cycle)."""
        recs = list(records)
        line = self.line(recs)
        prefill = line[0].rid if line and free_slots > 0 else None
        blocked = tuple((r.rid, i) for i, r in enumerate(line) if i >= max(free_slots, 0))
        runnable = [r for r in recs if r.admitted and r.generating and not r.paused
                    and (not r.parked or r.rid in evicting)]
        runnable.sort(key=lambda r: (urgency(r), r.rid))
        room = self.config.max_batch - (1 if prefill is not None else 0)
        chosen = runnable[:room]
        rows = len(chosen) + (1 if prefill is not None else 0)
        pressing = prefill is not None or any(self._pressing(r, now) for r in chosen)
        return TalkerPlan(prefill, tuple(r.rid for r in chosen), self.bucket(rows), pressing, blocked)

    def plan_evictions(self, records: Iterable[RequestRecord], now: float, free_slots: int) -> tuple[int, ...]:
        """Parked requests to close now so their slots go to streams waiting in line: as many as wait
        beyond the free slots and the slots already coming free, longest parked first, among those
        parked at least `park_evict_s` (a short pause between two sentences keeps its slot). A paused
        one is left alone: closed, it could not run to its end until its consumer reads again."""
        recs = list(records)
        need = len(self.line(recs)) - max(free_slots, 0) - sum(1 for r in recs if r.admitted and r.evicting)
        if need <= 0:
            return ()
        bound = now - self.config.park_evict_s
        idle = [r for r in recs if r.admitted and r.parked and not r.evicting and not r.paused
                and r.parked_since is not None and r.parked_since <= bound]
        idle.sort(key=lambda r: (r.parked_since, r.rid))
        return tuple(r.rid for r in idle[:need])

    def plan_codec(self, records: Iterable[RequestRecord], now: float, talker_pressing: bool,
                   cycle_s: float = 0.0, stream_rate: float | None = None) -> CodecPlan:
        """Decode ready chunks (`ready_frames`), most urgent first, up to the frames of `max_codec_rows`
        full chunks per cycle (always at least one chunk). A budget in frames, not in chunks, because
        a decode costs about its frames and streams opened together reach the ramp's middle steps
        together (docs/engine.md "Underruns"). When the talker has pressing work,
        chunks of streams with more than `defer_s` buffered wait: their listener can spare the time,
        a stream still waiting for its first audio cannot. `stream_rate`: the frames per second each
        stream is measured to get now, for the first-audio hold (`holds_first`); None: no hold."""
        ready: list[tuple[tuple[int, float], int, int]] = []
        for r in records:
            if not r.admitted or r.paused or r.pending_frames <= 0:
                continue
            n = self.ready_frames(r, now, cycle_s, stream_rate)
            if n == 0:
                continue
            if talker_pressing and (heard := r.timeline) is not None and heard.ahead_s(now) > self.config.defer_s:
                continue
            ready.append((urgency(r), r.rid, n))
        ready.sort()
        budget = self.config.max_codec_rows * max(self.config.ramp)
        chosen: list[tuple[int, int]] = []
        for _, rid, n in ready:
            if chosen and n > budget:
                break
            chosen.append((rid, n))
            budget -= n
        return CodecPlan(tuple(chosen))

    def ready_frames(self, rec: RequestRecord, now: float, cycle_s: float, stream_rate: float | None = None) -> int:
        """Frames to decode now (0: keep waiting). 0 while the first audio is held (`holds_first`).
        Then the next ramp size once it is pending; everything pending when no more frames are coming
        soon (the talker is done, or parked on text); and everything pending when the listener would run
        dry within two cycles (this one and the decode's): a decode that takes them must start by now
        (`ListenerTimeline.start_by`). Waiting until then, not until the full chunk, keeps the partial
        chunks as large as the listener's timeline allows: a stream near capacity that decoded a frame
        or two every cycle would spend its time in per-call codec overhead and fall further behind."""
        if self.holds_first(rec, now, cycle_s, stream_rate):
            return 0
        need = self.chunk_size(rec)
        if rec.pending_frames >= need:
            return need
        if not rec.generating or rec.parked:
            return rec.pending_frames
        heard = rec.timeline
        if heard is not None and heard.start_by(2 * cycle_s + self.config.flush_margin_s) < now:
            return rec.pending_frames
        return 0

    def holds_first(self, rec: RequestRecord, now: float, cycle_s: float, stream_rate: float | None) -> bool:
        """Hold a stream's first audio while the rest of its known text is predicted to come after its
        listener needs it, at most `first_hold_s` past its first frame: a listener who has started must
        keep hearing, so a later start beats a gap (docs/engine.md "The first-audio hold").

        Let go now, the listener plays the `n` frames made and then each later one as it comes; made at
        `stream_rate` r (taken `hold_error` too fast) the last of the `left` still to come is the latest
        against its need: it comes `left / r` from now and is needed `(n + left) / fps` from now, or
        from when a continuation's listener has heard the audio before it (`before`; the timeline's
        `after`). The hold ends once that is `2 cycles + flush_margin_s` early (its decode and the cycle
        that runs it), and for a continuation that margin before its listener runs dry. Only while the
        talker makes frames for it: a stream parked on text or done speaks what it has (its text's pace
        is not the engine's to hide)."""
        if (rec.first_audio_at is not None or rec.first_frame_at is None or not rec.generating or rec.parked
                or not stream_rate or stream_rate <= 0):
            return False
        margin = 2 * cycle_s + self.config.flush_margin_s
        # Let go now, its listener hears every frame from now on, or from when the audio before it runs out.
        heard = ListenerTimeline(now, (rec.pending_frames + rec.frames_left) / self.config.frames_per_s)
        rate = stream_rate / (1.0 + self.config.hold_error)
        late = now + rec.frames_left / rate - heard.after(rec.before).dry_at
        # The one hold rule (engine/listening.py); it must be `margin` early, not merely on time.
        return holds_first(now, rec.first_frame_at, late, rec.before,
                           HoldRule(self.config.first_hold_s, margin, -margin))

    def _pressing(self, rec: RequestRecord, now: float) -> bool:
        """No audio yet, or its listener has less than `low_water_s` ahead."""
        heard = rec.timeline
        return heard is None or heard.ahead_s(now) < self.config.low_water_s


def bucket_sizes(max_batch: int, buckets: Sequence[int] = DEFAULT_BUCKETS, min_bucket: int = 1) -> tuple[int, ...]:
    """The buckets for batches up to `max_batch`: the standard sizes from `min_bucket` below it, then
    `max_batch` itself (padding 20 rows to 32 would waste the work the cap was set to save)."""
    return (*[b for b in buckets if min_bucket <= b < max_batch], max(max_batch, min_bucket))


class ThroughputMeter:
    """What the core's cycles have cost, per batch bucket: how many streams it can keep ahead. Every
    working cycle reports its rows, frames completed and wall time; per bucket it keeps EWMAs of frames
    per row per cycle and of the cycle time, whose ratio is each stream's frame rate at that batch.
    `streams` is the largest N whose bucket gives each stream `FRAMES_PER_S × HEADROOM`. Buckets not
    measured yet are judged conservatively (from the warm-up's step costs, else no batching gain; never
    faster than measured); before any measurement, one stream. The core thread records, the event loop
    reads, under a lock held for a few arithmetic operations only. Pure: no torch, no clock of its own.
    docs/engine.md "Capacity" has the rules in full.
    """

    def __init__(self, buckets: Sequence[int], alpha: float = 0.1, frames_per_s: float = FRAMES_PER_S,
                 headroom: float = HEADROOM, alpha_up: float | None = 0.5) -> None:
        """`alpha_up`: the weight of a cycle slower than the estimate (None: `alpha`). A slowdown is
        believed at once, a speed-up slowly: admitting too many streams breaks them up, too few only
        makes a newcomer wait."""
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive sizes, got {buckets}")
        if not (0 < alpha <= 1 and frames_per_s > 0 and headroom >= 1):
            raise ValueError(f"need 0 < alpha <= 1, frames_per_s > 0, headroom >= 1; got {alpha}, "
                             f"{frames_per_s}, {headroom}")
        self.buckets = tuple(buckets)
        self.alpha, self.need = alpha, frames_per_s * headroom
        self.alpha_up = alpha if alpha_up is None else min(1.0, max(alpha, alpha_up))
        self._per_row: dict[int, float] = {}  # bucket → EWMA frames per row per cycle
        self._cycle: dict[int, float] = {}  # bucket → EWMA cycle seconds
        self._costs: dict[int, float] = {}  # bucket → one step's seconds at the warm-up (relative cost)
        self._lock = threading.Lock()

    def set_step_costs(self, costs: Mapping[int, float]) -> None:
        """What one batched step cost per bucket when the engine warmed up (talker and code predictor,
        no decoding): how a bucket larger than any measured is judged (by its cost relative to the
        largest measured one). Costs that are not positive and finite are left out."""
        good = {b: c for b, c in costs.items() if b in self.buckets and math.isfinite(c) and c > 0}
        with self._lock:
            self._costs = good

    def bucket(self, rows: int) -> int:
        i = bisect.bisect_left(self.buckets, max(rows, 1))
        return self.buckets[min(i, len(self.buckets) - 1)]

    def record(self, rows: int, frames: int, seconds: float) -> None:
        """One working cycle: `rows` streams were being generated, `frames` frames completed, in `seconds`."""
        if rows <= 0 or frames < 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        b = self.bucket(rows)
        per_row = frames / rows
        with self._lock:
            if b not in self._cycle:
                self._per_row[b], self._cycle[b] = per_row, seconds
            else:
                self._per_row[b] += self.alpha * (per_row - self._per_row[b])
                up = self.alpha_up if seconds > self._cycle[b] else self.alpha
                self._cycle[b] += up * (seconds - self._cycle[b])

    def _measured(self) -> dict[int, float]:
        """A snapshot: bucket → frames per second per stream, as measured."""
        with self._lock:
            return {b: self._per_row[b] / self._cycle[b] for b in self._cycle}

    def stream_rate(self, bucket: int, measured: dict[int, float] | None = None) -> float | None:
        """Frames per second each stream gets at `bucket` (measured or judged); None before any measurement."""
        if measured is None:
            measured = self._measured()
        if not measured:
            return None
        if bucket in measured:
            return measured[bucket]
        above = [b for b in measured if b > bucket]
        if above:
            return measured[min(above)]
        top = max(measured)
        costs = self._costs
        if top in costs and bucket in costs:  # as the warm-up's steps grew, never faster than measured
            return measured[top] * min(1.0, costs[top] / costs[bucket])
        return measured[top] * top / bucket  # the cycle grows with the rows: no gain from batching

    def streams(self, max_streams: int) -> int:
        """The most streams (≤ `max_streams`, ≥ 1) the measured throughput keeps ahead with headroom."""
        best, top, measured = 1, self.buckets[-1], self._measured()
        for n in range(1, max_streams + 1):
            rate = self.stream_rate(self.bucket(n), measured)
            if rate is None:
                break
            if n > top:  # more streams than batch rows: each is stepped in top / n of the cycles
                rate *= top / n
            if rate >= self.need:
                best = n
        return best

    def snapshot(self) -> dict[int, tuple[float, float]]:
        """bucket → (frames per row per cycle, cycle seconds): for benchmarks and logs."""
        with self._lock:
            return {b: (self._per_row[b], self._cycle[b]) for b in sorted(self._cycle)}
