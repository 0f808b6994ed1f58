"""The CPU voices' scheduling policy: pure functions over plain values and an injected `now`.

The mechanism (engine/cpu/stream.py's driver threads, engine/cpu/pool.py's workers) asks these
functions every decision that has a rule: which queued piece goes next, which running piece gives its
worker up to it, and when time alone calls for a new look (`plan`, a frozen `CpuPlan`, from `rank`,
`first_goes_next`, `choose_victim`); by when a piece must start (`piece_deadline`), how big the next
piece is cut (`piece_cost`, `ramp_limit`); and each stream's own plan (`stream_plan`, a frozen
`StreamPlan`): whether its held first audio goes now (`first_audio_late`, `holds_first`), whether a
`Waiting` notice goes out (`notice_due`), and when to look again (`release_at`). Every knob is in
`CpuPolicyConfig` with its unit and the measurement that set it. No threads, no clock, no onnx: the
tests drive each rule with a fake clock (tests/engine/cpu/test_cpu_policy.py). docs/scheduling.md
states the rules.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.listening import HoldRule, ListenerTimeline, holds_first

if TYPE_CHECKING:
    from concurrent.futures import Future


@dataclass(frozen=True, slots=True)
class CpuPolicyConfig:
    """Every tuned constant of the CPU voices, with its unit and why it has its value."""

    # Text cost (text.cost units: Latin letters, a Han character 3) of one piece, the longest a new stream
    # waits for a busy worker. 120 Piper letters (~7 s of speech) run 0.4 s on 2 quiet cores, 1-1.5 s
    # loaded (200 let a canary wait 3.2 s); 90 for Kokoro is about one of its 100-token model runs.
    piper_piece_cost: int = 120
    kokoro_piece_cost: int = 90
    # Share (0-1) of the audio a listener has ahead that a later piece's expected run may take (it waits
    # for a worker too): pieces grow with the buffer, as a codec decoder's chunk ramp does.
    ramp_share: float = 0.5
    # Least cost (letters) the ramp cuts to: a clause; below it a piece's edges dominate its run.
    ramp_min_cost: int = 24
    # Least cost (letters) the per-stream worker share cuts to: 48-letter pieces run 1.12x (Piper) and
    # 0.98x (Kokoro) the usual bound's time per audio second, 24-letter ones 1.30x and 1.23x
    # (bench/piece_cost.py).
    share_min_cost: int = 48
    # Seconds a piece waits for a worker, its listener dry, before a `Waiting` event says why.
    notice_after_s: float = 0.5
    # Seconds at most a stream's first audio is held for a later start instead of a gap.
    first_hold_s: float = 2.0
    # Seconds of predicted lateness the hold accepts (a gap this short is not heard).
    hold_margin_s: float = 0.05
    # Fraction a run takes past its RTF prediction, at least (the RTF is a mean over pieces; a fixed
    # 0.25 left gaps of 0.1 s where Kokoro's p90 was 1.35x, so the measured p90 rules above it).
    hold_error: float = 0.25
    # Fraction at most: beyond it the measurement is an outlier window, not a prediction.
    hold_error_max: float = 1.0
    # Fraction before a backend's runs are measured (a fresh server): 0.25 gapped its first reply in
    # 2 of 2 rounds at 1 reply/s, 0.5 in none of 3.
    hold_error_cold: float = 0.5
    # Seconds of speech a piece still to come (text not in, or not cut) is taken to be: the least the
    # ramp cuts (24 letters, ~1.5 s); Kokoro's first piece played out 0.9-1.5 s before the rest was made.
    next_min_s: float = 1.5
    # Seconds the audio before a continuation may move before its queued pieces' deadlines are moved:
    # Piper's estimates run 20-30 % long, and stale deadlines left a 4th sentence due 1.2 s late.
    follow_s: float = 0.05
    # Listeners remembered per listener group (one group per tenant) by the sentence-splitter vote, and
    # groups remembered: one listener per session, so far above the sessions a CPU engine serves at once.
    splitters_per_group: int = 1024
    splitter_groups: int = 256
    # Seconds: a running job expected to be over within this long keeps its worker (waiting costs less).
    yield_min_s: float = 0.2
    # The guard: a playing stream due within max(guard_min_s, guard_jobs x a long job's run) goes
    # before newcomers: one run to wait for a worker, one to run.
    guard_min_s: float = 0.5
    guard_jobs: float = 2.0
    # Milliseconds of audio per AudioChunk: keeps the gateway's queues and a barge-in's drop fine-grained.
    chunk_ms: int = 250
    # The RTF meter (engine/cpu/capacity.py): share (0-1) of measured throughput promised to listeners.
    headroom: float = 0.8
    # Weight (0-1) of the newest job in the EWMAs (about the last ten count), and of a costlier one:
    # a rise is believed at once (under-estimating admits streams that then break up).
    alpha: float = 0.1
    alpha_up: float = 0.5
    # RTF assumed before anything is measured: cold Kokoro on a loaded 2-core box.
    prior_rtf: float = 0.5
    # Seconds of speech a stream's first piece is taken to be, for the engine's word on how soon a stream
    # starting alone is heard (`Capacity.first_audio_s`: this times its backend's RTF; admission's prior,
    # which its own measurements then correct): the first clause goes alone from 2 syllables or words,
    # Kokoro's first piece is 1-2 s of speech and Piper's took 0.1-0.2 s at RTF 0.05-0.15
    # (docs/cpu_voices.md, "First audio"). Low rather than high: two slow measurements in a row overrule
    # a prior below them, only a few dozen a prior above them.
    first_piece_s: float = 1.5
    # Seconds of audio below which a job is weighed less (mostly per-run overhead).
    short_audio_s: float = 0.5
    # Runs in the overrun window (about a minute at 1 reply/s), the least it answers from, its quantile.
    overrun_window: int = 64
    overrun_min_runs: int = 8
    overrun_quantile: float = 0.9

    def piece_limit(self, backend: str) -> int:
        """The most one piece of `backend` may cost (text.cost units)."""
        return self.piper_piece_cost if backend == "piper" else self.kokoro_piece_cost


DEFAULT = CpuPolicyConfig()


class StreamStatus(enum.Enum):
    """Where a stream is, from its listener's side. Text progress (cut or not) is apart: it does not
    change what the listener hears."""

    NEW = "new"  # nothing heard, nothing before it: its first piece is first audio
    FOLLOWING = "following"  # nothing of its own out; audio of its listener's earlier stream plays first
    HELD = "held"  # its first audio is made and held for a later start instead of a gap
    PLAYING = "playing"  # its audio is going out
    ENDED = "ended"  # done, failed or cancelled


TRANSITIONS: dict[StreamStatus, frozenset[StreamStatus]] = {
    StreamStatus.NEW: frozenset({StreamStatus.HELD, StreamStatus.ENDED}),
    # back to NEW when the stream before it ended unheard: nothing plays before it then
    StreamStatus.FOLLOWING: frozenset({StreamStatus.NEW, StreamStatus.HELD, StreamStatus.ENDED}),
    StreamStatus.HELD: frozenset({StreamStatus.PLAYING, StreamStatus.ENDED}),
    StreamStatus.PLAYING: frozenset({StreamStatus.ENDED}),
    StreamStatus.ENDED: frozenset(),
}


# ---- what one stream shows the others: an immutable snapshot ----


@dataclass(frozen=True, slots=True)
class PieceSnapshot:
    """A submitted, undelivered piece of a stream, as the other streams' decisions see it."""

    seconds: float  # its estimated spoken length
    backend: str  # whose run time it takes ("piper" | "kokoro")
    started_at: float | None  # when its run started (None: queued)
    made_s: float | None  # once its run is over: the seconds of its audio not yet delivered
    handle: Future[None] | None = None  # its job's future: the pool says when it is expected to start
    text: str = ""
    audio_s: float = 0.0  # seconds of its audio made and not yet delivered (its run may go on)


class Snapshotted(Protocol):
    """A stream that publishes its snapshot (engine/cpu/stream.py's `CpuStream`)."""

    @property
    def snapshot(self) -> StreamSnapshot: ...

    def nudge(self) -> None:
        """Something it reads of its listener's other streams changed: its driver looks again."""
        ...


@dataclass(frozen=True, slots=True)
class StreamSnapshot:
    """One stream's state at one moment, immutable: what another stream of its listener reads of it
    (its listener's timeline through it, whether its text is all cut, its pieces) without its lock. A
    stream publishes a new one each time it lets its lock go, so no stream ever takes another's lock."""

    status: StreamStatus
    ended: bool  # its end went out to its consumer
    cancelled: bool
    all_cut: bool  # its text is all in and cut into pieces (or it is over)
    first_put_at: float | None  # when its first chunk went out
    sent_s: float  # seconds of its audio out so far
    held_s: float | None  # the first audio's length while it is held
    before: ListenerTimeline | None  # the audio before it, once known (a continuation's)
    pieces: tuple[PieceSnapshot, ...] = ()
    after: Snapshotted | None = None  # the stream before it of its listener, still linked
    next: Snapshotted | None = None  # the stream opened behind it for its listener
    next_likely: bool = False  # a stream is likely to open behind it (its client splits)
    pending_chars: int = 0  # text appended and not yet cut into pieces
    pending_segments: int = 0

    @property
    def awaits_first_audio(self) -> bool:
        """Its listener hears nothing yet and nothing is submitted: its next piece is its first audio."""
        return self.status is StreamStatus.NEW and not self.pieces


def chain(snapshot: StreamSnapshot, bound: int = 64) -> tuple[StreamSnapshot, ...]:
    """`snapshot` and those of the streams before it of its listener (each that one's published one),
    newest first. Links point only to older streams, so it ends; `bound` guards it anyway."""
    out = [snapshot]
    while out[-1].after is not None and len(out) < bound:
        out.append(out[-1].after.snapshot)
    return tuple(out)


def sent_timeline(streams: Sequence[StreamSnapshot], now: float) -> ListenerTimeline:
    """When the listener of `streams[0]` runs out of its audio out (or held, played from its release),
    which plays after the audio before it: that of `streams[1:]` (`chain`), then `before`."""
    snap = streams[0]
    before = snap.before
    if len(streams) > 1:  # it plays once the stream before it has
        heard = heard_timeline(streams[1:], now)
        if heard is not None:
            before = ListenerTimeline(heard.dry_at).after(before)
    if snap.first_put_at is None:
        if snap.held_s is None:
            return ListenerTimeline(now) if before is None else before
        return ListenerTimeline(max(now, before.dry_at if before else 0.0) + snap.held_s)
    start = max(snap.first_put_at, before.dry_at if before else 0.0)
    return ListenerTimeline(start + snap.sent_s)


def heard_timeline(streams: Sequence[StreamSnapshot], now: float) -> ListenerTimeline | None:
    """The listener's timeline through all of `streams[0]` that is known (its audio out and its pieces
    submitted); None when that listener hears nothing of it, nor of any stream before it."""
    snap = streams[0]
    if snap.awaits_first_audio:
        return None
    return sent_timeline(streams, now).then(sum(p.seconds for p in snap.pieces))


def advance(status: StreamStatus, to: StreamStatus) -> StreamStatus:
    """`to`, if the table allows it from `status` (staying put is allowed); else ValueError."""
    if to is not status and to not in TRANSITIONS[status]:
        raise ValueError(f"a stream cannot go from {status.value} to {to.value}")
    return to


# ---- the pool's order ----


def rank(deadline: float, seq: int, first: bool, now: float, guard_s: float) -> tuple[int, float, int]:
    """A queued job's place in line, smallest first: a playing stream's job due within `guard_s` (0),
    first-audio jobs oldest first (1), the rest earliest deadline first (2); ties in submission order."""
    if first:
        return (1, deadline, seq)
    return (0 if deadline <= now + guard_s else 2, deadline, seq)


def first_goes_next(first_run_s: float, rest_deadline: float | None, now: float, guard_s: float) -> bool:
    """Whether the oldest first-audio job goes before the most urgent playing stream's: unless that
    one falls due before the newcomer's run would be over (a job runs to its end)."""
    return rest_deadline is None or rest_deadline > now + max(guard_s, first_run_s)


def guard_s(job_s: float, cfg: CpuPolicyConfig = DEFAULT) -> float:
    """How close to running dry a playing stream may come before its job goes ahead of newcomers."""
    return max(cfg.guard_min_s, cfg.guard_jobs * job_s)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """What the victim rule needs of a running job."""

    key: int  # which job (the caller's)
    deadline: float
    run_s: float  # expected run time
    started: float  # when this run started
    wasted_s: float  # run time its earlier cut-short runs threw away
    first: bool  # a first-audio job
    can_yield: bool  # it has a yield hook and was not asked yet in this run


def choose_victim(urgent_deadline: float, urgent_first: bool, urgent_run_s: float, running: Sequence[RunningJob],
                  now: float, guard: float, cfg: CpuPolicyConfig = DEFAULT) -> int | None:
    """The running job (its key) that gives its worker up to the urgent job that goes next, or None.
    The urgent one: a first-audio job or one due within `guard`. A victim: not about to be over (nor
    before the urgent one must start), has thrown away less than half its run, and can run again,
    whole, after the urgent one by its own deadline (a newcomer's first audio always can for a playing
    stream's piece: it waits for those in line). The one with the most time to spare."""
    if not (urgent_first or urgent_deadline <= now + guard):
        return None
    best: RunningJob | None = None
    can_wait = 0.0 if urgent_first else max(0.0, urgent_deadline - now)
    for job in running:
        if not job.can_yield:
            continue
        ran = now - job.started
        if job.run_s - ran <= max(cfg.yield_min_s, can_wait) or job.wasted_s + ran > job.run_s / 2:
            continue
        if not (job.first and not urgent_first) and now + urgent_run_s + guard > job.deadline:
            continue
        if best is None or job.deadline > best.deadline:
            best = job
    return None if best is None else best.key


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """What the plan needs of a queued job."""

    key: int  # which job (the caller's; ties go to the smaller: submission order)
    deadline: float  # the latest it may start (a first-audio job's: its age)
    first: bool  # a first-audio job
    run_s: float  # expected run time


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """What the pool does now, decided at once from a snapshot of its jobs and `now`."""

    next: int | None  # the queued job the next free worker takes (None: nothing queued)
    victim: int | None  # the running job that gives its worker up to `next` now (None: none does)
    wake_at: float | None  # when time alone makes this plan stale (None: only an event changes it)


def plan(queued: Sequence[QueuedJob], running: Sequence[RunningJob], workers: int, now: float, guard: float,
         cfg: CpuPolicyConfig = DEFAULT) -> CpuPlan:
    """The pool's plan (docs/scheduling.md, "The plan"): which queued job goes next (`first_goes_next`
    between the oldest newcomer and the most urgent playing stream's, earliest deadline first within
    each), which running job gives its worker up to it when every worker is busy (`choose_victim`), and
    when the plan must be made again though nothing happened: the most urgent playing stream's job falls
    within the guard then (it may take a worker), or within the newcomer's run (it goes first). Other
    changes (a job queued, started, over, moved; the guard) are events the mechanism plans again on."""
    newcomer = min((q for q in queued if q.first), key=lambda q: (q.deadline, q.key), default=None)
    playing = min((q for q in queued if not q.first), key=lambda q: (q.deadline, q.key), default=None)
    if newcomer is not None and first_goes_next(newcomer.run_s, None if playing is None else playing.deadline,
                                                now, guard):
        head = newcomer
    else:
        head = playing
    victim = None
    if head is not None and len(running) >= workers:
        victim = choose_victim(head.deadline, head.first, head.run_s, running, now, guard, cfg)
    turns = []
    if playing is not None:
        turns.append(playing.deadline - guard)
        if newcomer is not None:
            turns.append(playing.deadline - max(guard, newcomer.run_s))
    wake_at = min((at for at in turns if now < at < math.inf), default=None)  # a job due never sets no timer
    return CpuPlan(None if head is None else head.key, victim, wake_at)


# ---- a stream's pieces ----


# The rules below take the listener's timeline (what it hears) and answer with a moment (a float): a
# deadline derived from the timeline is a time on the clock, not a timeline, so it stays a bare float,
# as `queued_at`, `free_at` and the pool's deadlines do.


def piece_deadline(sent: ListenerTimeline, before_s: Iterable[float], run_s: float) -> float:
    """The latest a piece may start: when its listener runs out of audio without it (the audio `sent`,
    plus the estimated length of the undelivered pieces before it), less its own expected run (ordering
    by run-out time alone starts a long piece too late)."""
    return sent.then(sum(before_s)).start_by(run_s)


def ramp_limit(piece_cost: int, piece_s: float, slack_s: float, rtf: float, share: float,
               cfg: CpuPolicyConfig = DEFAULT) -> int:
    """The most the next piece may cost (>= `piece_cost`: leave it whole). A job due soon never gives its
    worker up, so a long piece behind a short one would leave its listener dry while it runs: it may take
    `ramp_share` of the audio made in the listener's `slack_s`, down to `ramp_min_cost`, and the stream's
    `share` of the workers of it, down to `share_min_cost` (streams started together want their next
    pieces at once: 12 Piper streams on 2 workers gapped 1-8 of ~50 replies before this)."""
    ahead_s = max(0.0, slack_s) / max(rtf, 1e-3)  # audio seconds made in the slack
    limit = piece_cost
    for part, least in ((cfg.ramp_share, cfg.ramp_min_cost), (share, cfg.share_min_cost)):
        budget_s = ahead_s * part
        if piece_s > budget_s and piece_cost > least:
            limit = min(limit, max(least, int(piece_cost * budget_s / piece_s)))
    return limit


def hold_error(overrun: float | None, cfg: CpuPolicyConfig = DEFAULT) -> float:
    """How much longer than predicted a backend's run is taken to be: its measured overrun (p90 of run
    over prediction) less 1, within [hold_error, hold_error_max]; `hold_error_cold` before it is measured."""
    if overrun is None:
        return cfg.hold_error_cold
    return min(cfg.hold_error_max, max(cfg.hold_error, overrun - 1.0))


def notice_due(queued_at: float, sent: ListenerTimeline, cfg: CpuPolicyConfig = DEFAULT) -> float:
    """When a `Waiting` notice is due for a piece queued at `queued_at` and not started: its listener
    has nothing left (the audio `sent` has run dry), and it has waited `notice_after_s`."""
    return max(queued_at + cfg.notice_after_s, sent.dry_at)


def moved(before: ListenerTimeline, taken: ListenerTimeline | None, cfg: CpuPolicyConfig = DEFAULT) -> bool:
    """Whether the audio `before` a continuation now runs dry far enough (`follow_s`) from when it did as
    its queued pieces' deadlines `taken` it that they must move."""
    return taken is None or abs(before.dry_at - taken.dry_at) > cfg.follow_s


# ---- the first-audio hold ----


@dataclass(frozen=True, slots=True)
class PendingPiece:
    """A piece behind the first audio, as the hold sees it."""

    seconds: float  # its estimated spoken length
    run_s: float  # its expected run time, error included
    start: float | None  # when it started, or is expected to take a worker (None: now)
    made_s: float | None = None  # once made: the length of its audio (it is no longer late)
    rest_of_first: float = 0.0  # for the first audio's own piece, still running: the audio already out


def following(behind: StreamSnapshot | None, likely: bool, me: object) -> tuple[tuple[PieceSnapshot, ...], bool]:
    """The pieces of the stream opened behind `me` for its listener (its snapshot `behind`), and whether
    that one's text is all cut. None without one, and all cut unless one is `likely`: its text is then
    still to come; none, all cut, once that one is cancelled or no longer follows `me`."""
    if behind is None:
        return (), not likely
    if behind.cancelled or behind.after is not me:
        return (), True
    return behind.pieces, behind.all_cut


def following_pending(pieces: Iterable[PieceSnapshot], starts: Iterable[float | None], rtf: Callable[[str], float],
                      errors: Mapping[str, float]) -> list[PendingPiece]:
    """The pieces of the stream behind (`following`) as the hold weighs them: each runs its estimated
    length × its backend's RTF, stretched by that backend's error, from its (expected) start."""
    return [PendingPiece(p.seconds, p.seconds * rtf(p.backend) * (1 + errors[p.backend]), start, p.made_s)
            for p, start in zip(pieces, starts, strict=True)]


def first_audio_late(now: float, heard: ListenerTimeline, pending: Iterable[PendingPiece], more_text: bool,
                     free_at: float, next_run_s: float) -> float:
    """How late (seconds; -inf: not at all) the latest of the pieces after the first audio comes against
    the moment its listener needs it, if the first audio is let go now. Its listener hears until `heard`
    runs dry (the first audio's end), then each piece in turn; a piece comes at its start plus its run.
    With `more_text` (text still to come or to cut) one more piece of `next_run_s` comes from when a
    worker is free (`free_at`), soonest now."""
    ahead, late = heard.dry_at, -math.inf
    for piece in pending:
        if piece.made_s is not None:
            ahead += piece.made_s
            continue
        begin = now if piece.start is None else piece.start
        late = max(late, begin + piece.run_s - ahead)
        ahead += piece.seconds - piece.rest_of_first
    if more_text:
        late = max(late, max(now, free_at) + next_run_s - ahead)
    return late


def hold_until(now: float, before: ListenerTimeline | None, cfg: CpuPolicyConfig = DEFAULT) -> float:
    """The latest the first audio is held: `first_hold_s` from now, and for a continuation whose
    listener still hears the audio before it (`before`), until that runs dry (less `hold_margin_s`):
    held past it, it would make a gap heard now for one that may come later."""
    until = now + cfg.first_hold_s
    if before is not None and before.dry_at > now:
        until = min(until, before.dry_at - cfg.hold_margin_s)
    return until


# ---- the stream's plan ----


@dataclass(frozen=True, slots=True)
class HeldAudio:
    """A stream's held first audio, and what the hold rule weighs against it at one look."""

    ready_at: float  # when it was made: the hold's cap (`first_hold_s`) runs from here
    before: ListenerTimeline | None  # a continuation's: the audio before it (None: nothing plays)
    heard: ListenerTimeline  # its listener's, were it let go now: it runs dry at the held audio's end
    pending: tuple[PendingPiece, ...]  # the pieces after it (`first_audio_late`)
    more_text: bool  # text still to come or to cut: one more piece of `next_run_s`
    free_at: float  # when a worker is expected to be free
    next_run_s: float

    def late(self, now: float, later: float = 0.0) -> float:
        """`first_audio_late` at `now`, or were it let go `later` seconds on with nothing else changed
        (its listener's run-out moves with it: nothing plays before it)."""
        heard = ListenerTimeline(self.heard.runs_out_at + later, self.heard.queued_s)
        return first_audio_late(now + later, heard, self.pending, self.more_text, self.free_at, self.next_run_s)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What a stream's driver does now, decided at once from what it sees and `now`."""

    release: bool  # its held first audio goes now (True when none is held)
    notice: bool  # a `Waiting` notice goes out now
    wake_at: float | None  # when time alone makes this plan stale (None: only an event changes it)


def release_at(held: HeldAudio, now: float, late: float, cfg: CpuPolicyConfig = DEFAULT) -> float:
    """When a held first audio goes if nothing happens meanwhile (an event plans again sooner): at the
    latest `hold_until`; sooner once the lateness predicted now has run off, where waiting shortens it
    (a piece that starts later than now comes no later for the wait; one that starts now, or text still
    to come, comes later by as much, and waits for an event or the cap; so does a continuation's, whose
    listener hears the audio before it meanwhile)."""
    until = hold_until(held.ready_at, held.before, cfg)
    if held.before is None:
        at = now + late - cfg.hold_margin_s
        if at < until and held.late(now, at - now) <= cfg.hold_margin_s + 1e-9:
            return at
    return until


def stream_plan(now: float, notice_at: float | None, held: HeldAudio | None,
                cfg: CpuPolicyConfig = DEFAULT) -> StreamPlan:
    """A stream's plan (docs/scheduling.md, "A stream's plan"): whether its held first audio goes now
    (`holds_first` over `held.late`), whether a `Waiting` notice due at `notice_at` (`notice_due`) goes
    now, and when to look again though nothing happened: the notice's time, the hold's `release_at`."""
    wakes = []
    notice = notice_at is not None and notice_at <= now
    if notice_at is not None and not notice:
        wakes.append(notice_at)
    release = True
    if held is not None:
        late = held.late(now)
        if holds_first(now, held.ready_at, late, held.before, hold_rule(cfg)):
            release = False
            wakes.append(release_at(held, now, late, cfg))
    return StreamPlan(release, notice, min(wakes, default=None))


def hold_rule(cfg: CpuPolicyConfig = DEFAULT) -> HoldRule:
    """The CPU voices' bounds on the one first-audio hold rule (engine/listening.py)."""
    return HoldRule(cfg.first_hold_s, cfg.hold_margin_s, cfg.hold_margin_s)


def piece_cost(first_audio: bool, cost: int, piece_s: float, slack_s: float, rtf: float, share: float,
               cfg: CpuPolicyConfig = DEFAULT) -> int:
    """The most the next piece may cost (text.cost units; >= `cost`: leave it whole): a new listener's
    first audio as it comes (its size is `piece_limit`'s), any other as `ramp_limit` bounds it."""
    if first_audio:
        return cost
    return ramp_limit(cost, piece_s, slack_s, rtf, share, cfg)
