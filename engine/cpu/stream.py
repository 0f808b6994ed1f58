"""One utterance on the CPU voices: the mechanism that cuts its text, submits its pieces to the shared
pool and delivers their audio in order (engine/cpu/engine.py opens it; engine/cpu/policy.py decides).

Threads: each `append`ed segment is cut into pieces of bounded length (whole sentences where they fit,
engine/cpu/text.py `pieces`), and each piece becomes a job on the worker pool shared by all streams
(engine/cpu/pool.py), due when this stream's listener would run out of audio without it. Several
pieces of one stream may synthesise at once: at most `workers` behind the one being delivered, which
may still be running (its first audio held while the look-ahead ran on beside it: `_fill`). A
small driver thread per stream cuts its segments, submits their pieces and hands their audio, strictly
in order, to the stream's `EventBridge`; only that driver ever blocks on a slow consumer, never a pool
worker, and while it blocks its stream synthesises nothing past the look-ahead.

Locks: each stream has one (`_cond`) and takes no other stream's. What a stream needs of the other
streams of its listener (the one before it, `_after`: when its audio ends, whether its text is all
cut; the one behind it, `_next`, in the first-audio hold: its pieces) it reads from their published
`snapshot` (engine/cpu/policy.py `StreamSnapshot`, immutable), which each stream renews as it lets its
lock go (`StreamLock`, engine/cpu/stream_host.py). tests/engine/cpu/test_stream_locks.py holds that.

Time: the driver carries out its plan (`policy.stream_plan`: release the held first audio, send a
`Waiting`, and when to look again) and sleeps on its lock's bell until the plan's `wake_at` or a ring
(its own state changed, a neighbour's snapshot did: `nudge`, a pool event while its first audio is
held: `UrgencyPool.watch`). Every `now` is its engine's clock (`StreamHost.clock`), so a fake clock
drives it in tests (tests/engine/cpu/test_stream_clock.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import policy
from engine.cpu.espeak import Pinned
from engine.cpu.jobs import Piece, PieceJob, Voice
from engine.cpu.output import Output
from engine.cpu.policy import PendingPiece, PieceSnapshot, StreamSnapshot, StreamStatus
from engine.cpu.stream_host import StreamHost, StreamLock
from engine.cpu.stream_runs import StreamRuns
from engine.cpu.text import cost
from engine.listening import ListenerTimeline
from engine.stream import EventBridge
from engine.types import EngineError, StreamEvent, Waiting

log = logging.getLogger("voxgate.engine.cpu")


class CpuStream(StreamRuns):
    """One utterance on the CPU engine (see `CpuEngine.open_stream`).

    What it holds is bounded by the open work: segments appended and not yet cut into pieces (at most
    the engine's `max_pending_chars`), the pieces in flight (at most `workers`, each at most
    `PIECE_LIMITS`), and the bridge's `queue_size` chunks. Text and audio are dropped once delivered.
    """

    def __init__(self, engine: StreamHost, voice: Voice | None, language: str, sample_rate: int,
                 speed: float, word_timings: bool = False, pinned: Pinned | None = None,
                 before: ListenerTimeline | None = None, *, after: CpuStream | None = None,
                 listener: tuple[str, str] | None = None, next_likely: bool = False) -> None:
        self._engine = engine
        self._clock = engine.clock
        self._word_timings = word_timings
        self._pinned = pinned  # a lexicon's IPA words
        self._voice = voice
        self._language = language
        self.sample_rate = sample_rate
        self._speed = speed
        self._cancelled = threading.Event()
        self._bridge = EventBridge(engine.queue_size, on_cancel=self._abort)
        self._cond = StreamLock(self._publish)
        self._inbox: deque[tuple[int, str]] = deque()  # appended segments not yet cut into pieces
        self._appended = 0  # segments appended so far: the next one's index
        self._inbox_chars = 0
        self._cutter: Iterator[Piece] | None = None  # the segment being cut (the driver's only)
        self._jobs: deque[PieceJob] = deque()  # submitted, undelivered, in order; the first is delivering
        self._held_s: float | None = None  # the first audio's length while `_hold_first` keeps it
        self._finished = False
        self._first_put_at: float | None = None  # when the listener could start playing
        # A continuation: its listener's timeline of the audio before this stream's. Its pieces are due
        # by its end, the first one too: that listener has heard speech, and a gap now is a break in it.
        self._before = before
        # The stream before it of the same listener, open when it opened (`StreamRequest.listener`): it is
        # heard once that one has played. Until that one's text is all cut into pieces this one submits
        # none (its pieces' deadlines follow that one's end, not yet known); once that one ends, its
        # timeline becomes `_before` and the link is dropped (no chain of ended streams is kept).
        self._after = after
        # The stream opened behind it for its listener (its next sentence, in `sentence` mode): its first
        # audio is held for that one's pieces too once its own text is all cut (`_hold_first`).
        self._next: CpuStream | None = None
        # Its listener's client sends sentence by sentence (`Splitters`) and it opens a turn:
        # until a stream opens behind it, its first audio is held as for text still to come (`_hold_first`).
        self._next_likely = next_likely
        self.listener = listener  # (listener group, listener name), as the engine links its streams
        self._before_taken: ListenerTimeline | None = None  # the audio before it, as its deadlines took it
        # Where it is from its listener's side (engine/cpu/policy.py `TRANSITIONS`), under `_cond`.
        self._status = StreamStatus.FOLLOWING if after is not None or before is not None else StreamStatus.NEW
        self._frames_put = 0
        self._notified = False  # a Waiting went out and no audio has followed it yet
        self._snapshot = self._state()  # renewed as its lock is let go (`StreamLock`)
        self._driver = threading.Thread(target=self._drive, name="cpu-stream", daemon=True)
        self._driver.start()

    def append(self, text: str) -> None:
        """Queue one segment (O(1): cutting it into pieces happens on the stream's own thread)."""
        with self._cond:
            if self._finished:
                raise EngineError("invalid_state", "append after finish")
            if self._cancelled.is_set():
                return
            index = self._appended
            self._appended += 1  # spent even when refused, so later segments keep their indices
            bound = self._engine.max_pending_chars
            if self._inbox_chars + len(text) > bound:
                raise EngineError("queue_full", f"segment {index} refused: the stream already holds "
                                  f"{self._inbox_chars} characters not yet synthesised (at most {bound})")
            self._inbox.append((index, text))
            self._inbox_chars += len(text)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def cancel(self) -> None:
        self._bridge.cancel()  # drops queued audio, ends with "cancelled", then calls _abort

    def events(self) -> AsyncIterator[StreamEvent]:
        return self._bridge.events()

    @property
    def first_audio_at(self) -> float | None:
        """When its first chunk went out (its engine's clock; None before): its listener could start playing."""
        return self._first_put_at

    @property
    def status(self) -> StreamStatus:
        """Where it is from its listener's side (engine/cpu/policy.py `StreamStatus`)."""
        return self._status

    @property
    def ended(self) -> bool:
        """Its end went out to its consumer (done, failed or cancelled)."""
        return self._bridge.ended

    @property
    def queued_events(self) -> int:
        """Events queued for its consumer, not yet read (at most the engine's `queue_size`)."""
        return self._bridge.queued

    @property
    def snapshot(self) -> StreamSnapshot:
        """Its state as it last let its lock go (immutable; read without any lock)."""
        return self._snapshot

    def join(self, timeout: float | None = None) -> bool:
        """Wait for its driver thread to be over (its end out, its state dropped); True if it is."""
        self._driver.join(timeout)
        return not self._driver.is_alive()

    def link_next(self, stream: CpuStream) -> None:
        """`stream` was opened behind it for its listener (the engine links them): its first audio is
        held for that one's pieces too once its own text is all cut (`_hold_first`)."""
        with self._cond:
            self._next = stream
            self._cond.notify_all()

    def nudge(self) -> None:
        """Its driver looks again now: what it reads of its listener's other streams changed, or the
        clock moved in a way its timer cannot see (a fake clock: `CpuEngine.wake`). Takes no lock."""
        self._cond.bell.set()

    # ---- internals ----

    def _state(self) -> StreamSnapshot:
        """Under `_cond`: its state now, as the other streams of its listener may read it."""
        return StreamSnapshot(
            self._status, self._bridge.ended, self._cancelled.is_set(), self._all_cut(), self._first_put_at,
            self._frames_put / self.sample_rate, self._held_s, self._before,
            tuple(job.snapshot() for job in self._jobs),
            self._after, self._next, self._next_likely, self._inbox_chars, len(self._inbox))

    def _publish(self) -> None:
        """Under `_cond`, as it is let go: its snapshot renewed. If it changed, the streams of its listener
        that read it are nudged: the one before it (its hold reads this one's pieces) and those behind it
        (their deadlines follow this one's audio; they wait for its text to be cut)."""
        snapshot = self._state()
        if snapshot == self._snapshot:
            return
        self._snapshot = snapshot
        if self._after is not None:
            self._after.nudge()
        behind, seen = self._next, 0
        while behind is not None and seen < 64:  # links point to newer streams only; bounded anyway
            behind.nudge()
            behind, seen = behind.snapshot.next, seen + 1

    def _abort(self) -> None:
        with self._cond:
            self._cancelled.set()
            self._to(StreamStatus.ENDED)
            jobs = list(self._jobs)
            self._inbox.clear()
            self._inbox_chars = 0
            self._cond.notify_all()
        for job in jobs:  # outside the lock: a cancelled future's callback takes it
            job.abort()

    def _fill(self, held: PieceJob | None = None) -> None:
        """Cut segments into pieces and submit them until `workers` pieces are in flight (the look-ahead),
        besides `held`, the piece whose audio is the first audio `_hold_first` holds (kept in `_jobs` while
        the hold lasts, it took the look-ahead's place: the text that came meanwhile waited out the hold).
        Runs on the driver thread: cutting is linear in the text but never on the event loop."""
        while True:
            with self._cond:
                in_flight = len(self._jobs) - (held is not None and held in self._jobs)
                if self._cancelled.is_set() or in_flight >= self._engine.workers or self._behind():
                    return
                if self._cutter is None:
                    if not self._inbox:
                        return
                    index, text = self._inbox.popleft()
                    self._inbox_chars -= len(text)
                    # A generator: set here, under the lock, so a stream behind this one sees the text is
                    # still being cut (`_all_cut`); it cuts outside the lock, as it is consumed.
                    self._cutter = self._engine.cut_pieces(self._voice, self._language, index, text)
                cutter = self._cutter
            piece = next(cutter, None)
            if piece is not None:
                piece = self._ramped(piece)
                self._submit(piece)
            if piece is None or piece.last:  # the segment is all cut (seen now, not at the next look)
                with self._cond:
                    self._cutter = None

    def _behind(self) -> bool:
        """Under `_cond`: whether the stream before it (`_after`) still has text not cut into pieces; so
        this one waits to submit. Once that one has ended, its end is taken and the link dropped."""
        if self._after is None:
            return False
        before = self._after.snapshot  # read, not locked: no stream takes another's lock
        if not before.ended:
            return not before.all_cut
        heard = policy.heard_timeline(policy.chain(before), self._clock())
        if heard is not None:
            self._before = ListenerTimeline(heard.dry_at).after(self._before)
        self._after = None
        if self._before is None and self._status is StreamStatus.FOLLOWING:
            self._to(StreamStatus.NEW)  # that one ended unheard: nothing plays before this one
        return False

    def _to(self, status: StreamStatus) -> None:
        """Under `_cond`: move to `status` (a transition `TRANSITIONS` allows)."""
        self._status = policy.advance(self._status, status)

    def _all_cut(self) -> bool:
        """Under `_cond`: its text is all in and cut into pieces (or it is over)."""
        return self._cancelled.is_set() or (self._finished and not self._inbox and self._cutter is None)

    def _ramped(self, piece: Piece) -> Piece:
        """`piece`, or its first part as `policy.ramp_limit` bounds it (the rest goes back to the cutter,
        in order). A new listener's first piece is its first audio and is left as it is."""
        with self._cond:
            first = self._awaits_first_audio()
            slack = self._timeline().dry_at - self._clock()
        size = cost(piece.text)
        limit = policy.piece_cost(first, size, piece.seconds, slack, self._engine.rtf(piece.voice.backend),
                                  self._ramp_share(), self._engine.config)
        if limit >= size:
            return piece
        cut = piece.split(limit)
        if len(cut) < 2:
            return piece
        assert self._cutter is not None
        self._cutter = itertools.chain(cut[1:], self._cutter)
        return cut[0]

    def _ramp_share(self) -> float:
        """Its part of the workers (`_ramped`): the workers over the streams with a job queued or running,
        itself included."""
        return self._engine.workers / self._engine.pool.owners(also=self)

    def _submit(self, piece: Piece) -> None:
        """Hand one piece to the pool: a first-audio job while its listener hears nothing, else due by
        its listener's timeline (`_deadline`)."""
        job = PieceJob(piece, self._clock())
        with self._cond:
            if self._cancelled.is_set():
                return
            deadline = self._deadline(self._jobs, piece)
            if self._before_counts():
                self._before_taken = self._sent()
            # The pieces after its first are first-audio jobs too while nothing is out: the held first
            # audio waits for them (ranked by a deadline from now, a second piece ran before its first).
            first_audio = self._hears_nothing()
            self._jobs.append(job)
        try:
            job.future = self._engine.pool.submit(deadline, partial(self.run_piece, job), owner=self,
                                                   first_audio=first_audio, run_s=self._run_s(piece),
                                                   yield_to=partial(self.yield_worker, job))
        except RuntimeError:  # the pool is shut down: the engine is closing
            with self._cond:
                job.error = EngineError("engine_closed", "the CPU engine is closed")
                job.done = True
                self._cond.notify_all()
            return
        job.future.add_done_callback(partial(self._job_over, job))

    def _deadline(self, before: Iterable[PieceJob], piece: Piece) -> float:
        """Under `_cond`: the latest `piece` may start, behind the undelivered jobs `before` it
        (`policy.piece_deadline` on its listener's timeline)."""
        return policy.piece_deadline(self._sent(), (j.piece.seconds for j in before), self._run_s(piece))

    def _reschedule(self) -> None:
        """Once a piece's audio is out, its real length stands for its estimate: the queued pieces behind
        it get the deadlines that follow (an estimate too long leaves them due after their listener runs dry)."""
        with self._cond:
            moves, before = [], []
            for job in self._jobs:
                if not job.started and job.future is not None:
                    moves.append((job.future, self._deadline(before, job.piece)))
                before.append(job)
        for future, deadline in moves:  # outside the stream's lock, as every call into the pool
            self._engine.pool.reschedule(future, deadline)

    def _before_counts(self) -> bool:
        """Under `_cond`: its deadlines run from the end of audio before it (another stream of its listener,
        `_after`, or the end that one left, `_before`): nothing of its own is out or held."""
        return self._status is StreamStatus.FOLLOWING

    def _follow_before(self) -> None:
        """While nothing of it is out: when the audio before it now ends far from what its queued pieces'
        deadlines took (`policy.moved`), they move (`_reschedule`)."""
        with self._cond:
            if not self._jobs or not self._before_counts():
                return
            if self._after is not None:
                self._behind()  # takes that one's end once it has ended, and drops the link
            before = self._sent()
            if not policy.moved(before, self._before_taken, self._engine.config):
                return
            self._before_taken = before
        self._reschedule()

    def _timeline(self, before: Iterable[PieceJob] | None = None) -> ListenerTimeline:
        """Under `_cond`: its listener's timeline: the audio sent (`_sent`), then the estimated length of
        the undelivered pieces `before` the next (by default all of them)."""
        return self._sent().then(sum(j.piece.seconds for j in (self._jobs if before is None else before)))

    def _sent(self, now: float | None = None) -> ListenerTimeline:
        """Under `_cond`: when its listener runs out of the audio delivered (or held, played from its
        release), which plays after the audio before this stream's (a continuation's): `policy.sent_timeline`
        over its state now and the snapshots of the streams before it."""
        return policy.sent_timeline(policy.chain(self._state()), self._clock() if now is None else now)

    def _hears_nothing(self) -> bool:
        """Under `_cond`: its listener hears nothing yet: no audio out, none held (`_hold_first`), no
        continuation, no stream before it."""
        return self._status is StreamStatus.NEW

    def _awaits_first_audio(self) -> bool:
        """Under `_cond`: its listener hears nothing yet, and nothing is submitted: the next piece is its
        first audio."""
        return self._hears_nothing() and not self._jobs

    def _has_news(self) -> bool:
        """Under `_cond`: whether the driver has something to do."""
        if self._cancelled.is_set():
            return True
        if self._jobs and (self._jobs[0].audio or self._jobs[0].done):
            return True
        if len(self._jobs) < self._engine.workers and (self._inbox or self._cutter is not None) and not self._behind():
            return True
        return self._finished and not self._jobs and not self._inbox and self._cutter is None

    def _notice_due(self, now: float) -> float | None:
        """Under `_cond`: when a `Waiting` is due for the piece at the head, or None when none is: it
        waits for a worker (not started), its listener has nothing left to play (by `now`: one reading
        of the clock for the whole plan), and no notice went out since the last audio."""
        if self._notified or not self._jobs or self._jobs[0].started:
            return None
        return policy.notice_due(self._jobs[0].queued_at, self._sent(now), self._engine.config)

    def _notify_waiting(self, head: PieceJob) -> None:
        self._notified = True  # once per wait, even unsent: the driver must not retry at every wake-up
        ahead = self._engine.pool.ahead(head.future) if head.future is not None else None
        if ahead is None:
            return  # it has started meanwhile
        with contextlib.suppress(TimeoutError):  # a full bridge: the consumer has audio yet to take
            self._bridge.put(Waiting("capacity", ahead), timeout=0)

    def _drive(self) -> None:
        """The driver thread: cut and submit pieces, wait for the head's audio, deliver it, in order."""
        chunk = max(1, self.sample_rate * self._engine.config.chunk_ms // 1000)
        output = Output(self._bridge, self.sample_rate, chunk, self._word_timings, self._put)
        try:
            while True:
                self._follow_before()
                self._fill()
                took = self._take_head()
                if took is None:
                    return  # cancelled
                if took is _ALL_DONE:
                    break
                if isinstance(took, tuple) and not self._play(*took, output):
                    return
            self._bridge.end("done")
        except Exception as exc:
            log.exception("CPU stream driver failed")
            self._bridge.end("error", str(exc))
            self._abort()
        finally:  # nothing of the stream outlives it
            with self._cond:
                self._to(StreamStatus.ENDED)
                self._jobs.clear()
                self._inbox.clear()
                self._inbox_chars = 0
                self._cutter = None
                self._after = self._next = None
            self._engine.stream_ended(self)

    def _take_head(self) -> tuple[PieceJob, list[Any], bool, Exception | None] | object | None:
        """Take the head job's audio: (head, audio, done, error); `_ALL_DONE` once everything is delivered;
        `_NOTHING` to look again, once its plan is carried out while nothing is to be done (a due `Waiting`
        sent, or a sleep until an event or the plan's `wake_at`); None once cancelled."""
        with self._cond:
            idle = not self._has_news()
            if idle:
                now = self._clock()
                decided = policy.stream_plan(now, self._notice_due(now), None, self._engine.config)
                head = self._jobs[0] if self._jobs else None
        if idle:
            if decided.notice and head is not None:
                self._notify_waiting(head)
            else:
                self._sleep(decided.wake_at)
            return _NOTHING
        with self._cond:
            if self._cancelled.is_set():
                return None
            if not self._jobs:
                return _ALL_DONE if self._finished and not self._inbox and self._cutter is None else _NOTHING
            head = self._jobs[0]
            audio = list(head.audio)
            head.audio.clear()
            done, error = head.done, head.error
            if done:
                self._jobs.popleft()
        if not audio and not done:
            return _NOTHING
        return head, audio, done, error

    def _sleep(self, until: float | None) -> None:
        """The driver's one wait: until its bell rings (`StreamLock`: an event) or its clock reads `until`."""
        bell = self._cond.bell
        timeout = None if until is None else min(max(0.0, until - self._clock()), threading.TIMEOUT_MAX)
        bell.wait(timeout)
        bell.clear()  # before the next look at its state: a ring after it is seen then

    def _play(self, head: PieceJob, audio: list[Any], done: bool, error: Exception | None, output: Output) -> bool:
        """Deliver what `head` made (its run need not be over: a Piper piece puts out each sentence as
        it is made), holding the stream's first audio (`_hold_first`). False: the stream is over."""
        seg = head.piece.segment
        if audio and self._first_put_at is None:
            self._hold_first(audio, head)
            if self._cancelled.is_set():
                return False
        if not all(output.run(seg, pcm, rate, words) for pcm, rate, words in audio):
            return False
        if error is not None:
            self._bridge.end("error", f"segment {seg}: {error}")
            self._abort()  # the stream is over: stop its other pieces' work
            return False
        if done and head.piece.last and not output.end_segment(seg):
            return False
        if done:
            self._reschedule()
        return True

    def _hold_first(self, audio: list[tuple[np.ndarray, int, Any]], head: PieceJob) -> None:
        """Before a stream's first audio (`audio`, from `head`: out of `_jobs` once done, else still in
        it while its run goes on): hold it as its plan says (`policy.stream_plan`: while the pieces after
        it are predicted to come after its listener needs them, the rule in engine/listening.py
        `holds_first`). What the prediction weighs is `_hold_look`'s; docs/scheduling.md tells why. It
        looks again at each event that moves it (its own pieces, its listener's other streams, the pool's
        jobs: `UrgencyPool.watch`) or at the plan's `wake_at`."""
        have = sum(pcm.size / rate for pcm, rate, _ in audio)
        start = self._clock()
        cfg = self._engine.config
        with self._cond:
            before = self._sent() if self._before_counts() else None  # a continuation's: the audio before it
            if before is not None and before.dry_at <= start:
                before = None  # that audio has played: held as a new listener's
            self._held_s = have  # the pieces after it are cut and due by this audio's end
            if self._status is not StreamStatus.ENDED:  # cancelled meanwhile: the next look returns
                self._to(StreamStatus.HELD)
        engine, backend = self._engine, head.piece.voice.backend
        next_run_s = cfg.next_min_s * engine.rtf(backend) * (1 + engine.hold_error(backend))
        pool, bell = engine.pool, self._cond.bell
        pool.watch(bell)
        told = False
        try:
            while True:
                self._fill(head)  # the look-ahead runs on while the first audio waits, on text that comes too
                looked = self._hold_look(head, have, next_run_s, start, before)
                if looked is None:
                    return
                decided = policy.stream_plan(looked[1], None, looked[0], cfg)
                if decided.release:
                    return
                if not told:  # it waits: say so (and that its first audio is made: admission measures to here)
                    told = True
                    with contextlib.suppress(TimeoutError):  # a full bridge: the consumer has events to take
                        self._bridge.put(Waiting("pacing"), timeout=0)
                self._sleep(decided.wake_at)
        finally:
            pool.unwatch(bell)

    def _hold_look(self, head: PieceJob, have: float, next_run_s: float, ready_at: float,
                   before: ListenerTimeline | None) -> tuple[policy.HeldAudio, float] | None:
        """One look of the hold: the held audio and what comes after it, as `policy.stream_plan` weighs
        them, and the time of the look (None: cancelled). The pool's predictions are asked outside the
        stream's lock."""
        with self._cond:
            if self._cancelled.is_set():
                return None
            after = [(job, job.started_at, job.future) for job in self._jobs]  # at most `workers`
        following, following_cut = self._following()
        engine, pool = self._engine, self._engine.pool
        # Each piece runs past its prediction by its backend's error; a job it waits behind (another
        # stream's, of either backend) by the costliest backend's.
        errors = engine.hold_errors()
        stretch = 1.0 + max(errors.values())
        starts = [s if s is not None or f is None else pool.expected_start(f, stretch) for _, s, f in after]
        next_starts = [p.started_at if p.started_at is not None or p.handle is None
                       else pool.expected_start(p.handle, stretch)
                       for p in following]  # fmt: skip
        free_at = pool.expected_free(stretch)
        with self._cond:
            now = self._clock()
            def run_s(job: PieceJob) -> float:
                return self._run_s(job.piece) * (1 + errors[job.piece.voice.backend])

            pending = [PendingPiece(job.piece.seconds, run_s(job), start, job.audio_s if job.done else None,
                                    have if job is head else 0.0)
                       for (job, _, _), start in zip(after, starts, strict=True)]  # fmt: skip
            all_cut = self._all_cut()
            if all_cut:  # then its listener's next stream's, which play once it has
                pending += policy.following_pending(following, next_starts, self._engine.rtf, errors)
            more_text = not all_cut or not following_cut
            return policy.HeldAudio(ready_at, before, self._sent(now), tuple(pending), more_text,
                                    free_at, next_run_s), now

    def _following(self) -> tuple[tuple[PieceSnapshot, ...], bool]:
        """The pieces of the stream opened behind it for its listener (`_next`, read from its snapshot, not
        its lock), and whether that one's text is all cut (`policy.following`)."""
        with self._cond:
            behind, likely = self._next, self._next_likely
        return policy.following(None if behind is None else behind.snapshot, likely, self)

    def _put(self, frames: int) -> None:
        """A chunk is out (`Output`): `frames` put so far; the first makes it a playing stream."""
        with self._cond:  # its snapshot follows the audio out
            if self._first_put_at is None:
                self._first_put_at = self._clock()
                if self._status is not StreamStatus.ENDED:
                    self._to(StreamStatus.PLAYING)
            self._frames_put = frames
            self._notified = False


_ALL_DONE = object()  # `_take_head`: every piece delivered, the text all in
_NOTHING = object()  # `_take_head`: nothing to deliver yet
