"""One utterance on the CPU voices: the mechanism that cuts its text, submits its pieces to the shared
pool and delivers their audio in order (engine/cpu/engine.py opens it; engine/cpu/policy.py decides).

Threads: each `append`ed segment is cut into pieces of bounded length (whole sentences where they fit,
engine/cpu/text.py `pieces`), and each piece becomes a job on the worker pool shared by all streams
(engine/cpu/pool.py), due when this stream's listener would run out of audio without it. Several
pieces of one stream may synthesise at once, at most `workers` including the one being delivered. A
small driver thread per stream cuts its segments, submits their pieces and hands their audio, strictly
in order, to the stream's `EventBridge`; only that driver ever blocks on a slow consumer, never a pool
worker, and while it blocks its stream synthesises nothing past the look-ahead.

Locks: each stream has one (`_cond`) and takes no other stream's. What a stream needs of the other
streams of its listener (the one before it, `_after`: when its audio ends, whether its text is all
cut; the one behind it, `_next`, in the first-audio hold: its pieces) it reads from their published
`snapshot` (engine/cpu/policy.py `StreamSnapshot`, immutable), which each stream renews as it lets its
lock go (`StreamLock`, engine/cpu/stream_host.py). tests/engine/cpu/test_stream_locks.py holds that.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import policy
from engine.cpu.espeak import Pinned
from engine.cpu.jobs import Piece, PieceJob, Voice
from engine.cpu.output import Output
from engine.cpu.policy import PendingPiece, PieceSnapshot, StreamSnapshot, StreamStatus
from engine.cpu.pool import Preempted
from engine.cpu.stream_host import StreamHost, StreamLock
from engine.cpu.text import cost
from engine.listening import HoldRule, ListenerTimeline, holds_first
from engine.stream import EventBridge
from engine.types import EngineError, StreamEvent, Waiting

log = logging.getLogger("voxgate.engine.cpu")


class CpuStream:
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
        self._before_taken: float | None = None  # when the audio before it ends, as its deadlines took it
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
        """When its first chunk went out (time.monotonic; None before): its listener could start playing."""
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

    # ---- internals ----

    def _state(self) -> StreamSnapshot:
        """Under `_cond`: its state now, as the other streams of its listener may read it."""
        return StreamSnapshot(
            self._status, self._bridge.ended, self._cancelled.is_set(), self._all_cut(), self._first_put_at,
            self._frames_put / self.sample_rate, self._held_s, self._before,
            tuple(job.snapshot() for job in self._jobs),
            self._after, self._next, self._next_likely, self._inbox_chars, len(self._inbox))

    def _publish(self) -> None:
        """Under `_cond`, as it is let go: its snapshot renewed."""
        self._snapshot = self._state()

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
        heard = policy.heard_timeline(policy.chain(before), time.monotonic())
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
            if self._awaits_first_audio():
                return piece
            slack = self._timeline().dry_at - time.monotonic()
        size = cost(piece.text)
        limit = policy.ramp_limit(size, piece.seconds, slack, self._engine.rtf(piece.voice.backend),
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
        job = PieceJob(piece)
        with self._cond:
            if self._cancelled.is_set():
                return
            deadline = self._deadline(self._jobs, piece)
            if self._before_counts():
                self._before_taken = self._sent().runs_out_at
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
        return self._timeline(before).start_by(self._run_s(piece))

    def _run_s(self, piece: Piece) -> float:
        """How long `piece` is expected to run: its estimated length × its backend's measured RTF."""
        return piece.seconds * self._engine.rtf(piece.voice.backend)

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
            until = self._sent().runs_out_at
            if not policy.moved(until, self._before_taken, self._engine.config):
                return
            self._before_taken = until
        self._reschedule()

    def _timeline(self, before: Iterable[PieceJob] | None = None) -> ListenerTimeline:
        """Under `_cond`: its listener's timeline: the audio sent (`_sent`), then the estimated length of
        the undelivered pieces `before` the next (by default all of them)."""
        return self._sent().then(sum(j.piece.seconds for j in (self._jobs if before is None else before)))

    def _sent(self) -> ListenerTimeline:
        """Under `_cond`: when its listener runs out of the audio delivered (or held, played from its
        release), which plays after the audio before this stream's (a continuation's): `policy.sent_timeline`
        over its state now and the snapshots of the streams before it."""
        return policy.sent_timeline(policy.chain(self._state()), time.monotonic())

    def _hears_nothing(self) -> bool:
        """Under `_cond`: its listener hears nothing yet: no audio out, none held (`_hold_first`), no
        continuation, no stream before it."""
        return self._status is StreamStatus.NEW

    def _awaits_first_audio(self) -> bool:
        """Under `_cond`: its listener hears nothing yet, and nothing is submitted: the next piece is its
        first audio."""
        return self._hears_nothing() and not self._jobs

    def run_piece(self, job: PieceJob) -> None:
        """A pool job's body, on a worker: `job`'s synthesis, its audio handed to the driver as it comes."""
        with self._cond:
            job.started_at = time.monotonic()
            if job.preempted:  # it gave its worker up before: it runs again, whole
                job.preempted, job.run_options.terminate = False, False
        if self._cancelled.is_set():  # set before any abort: a terminate it clears above is not lost
            return
        p = job.piece
        t0, made, predicted_s = time.perf_counter(), 0.0, self._run_s(p)
        try:
            for audio in self._engine.synthesise(p.voice, p.lang, p.text, self._speed, self._cancelled,
                                                  job.run_options, self._pinned):
                made += audio[0].size / audio[1]
                with self._cond:
                    if job.preempted:  # asked before this run was over: its audio comes from the next
                        break
                    job.made += 1
                    job.audio.append(audio)
                    self._cond.notify_all()
            self._gave_up(job)
            if not self._cancelled.is_set():  # a cut-short run says nothing of the cost
                self._engine.measured(p.voice.backend, time.perf_counter() - t0, made, predicted_s)
        except Preempted:
            raise
        except Exception as exc:  # reported by the driver, in order, as StreamEnd("error")
            self._gave_up(job)  # an aborted run raises
            if not self._cancelled.is_set():
                log.exception("CPU voice synthesis failed for segment %d", p.segment)
                with self._cond:
                    job.error = exc

    def yield_worker(self, job: PieceJob) -> bool:
        """The pool asks `job` to give its worker up to a more urgent job (engine/cpu/pool.py). Only a
        run that has put out no audio yet can: its model run is aborted, and it runs again, whole, when
        its turn comes back."""
        with self._cond:
            if job.done or job.made or job.preempted or self._cancelled.is_set():
                return False
            job.preempted = True
        job.run_options.terminate = True
        return True

    def _gave_up(self, job: PieceJob) -> None:
        """In `job`'s run: if it was asked to give its worker up, it is queued again (`Preempted`)."""
        with self._cond:
            if not job.preempted:
                return
            job.started_at = None
        raise Preempted

    def _job_over(self, job: PieceJob, future: Future[None]) -> None:
        """The future's done-callback: run, failed or cancelled before it ran, the job is over."""
        with self._cond:
            shut = future.cancelled() or future.exception() is not None  # a job's own failure is job.error
            if shut and not self._cancelled.is_set() and job.error is None:
                job.error = EngineError("engine_closed", "the CPU engine is closed")  # the pool shut down
            job.done = True
            self._cond.notify_all()

    def _has_news(self) -> bool:
        """Under `_cond`: whether the driver has something to do."""
        if self._cancelled.is_set():
            return True
        if self._jobs and (self._jobs[0].audio or self._jobs[0].done):
            return True
        if len(self._jobs) < self._engine.workers and (self._inbox or self._cutter is not None) and not self._behind():
            return True
        return self._finished and not self._jobs and not self._inbox and self._cutter is None

    def _notice_due(self) -> float | None:
        """Under `_cond`: when a `Waiting` is due for the piece at the head, or None when none is: it
        waits for a worker (not started), its listener has nothing left to play, and no notice went out
        since the last audio."""
        if self._notified or not self._jobs or self._jobs[0].started:
            return None
        return policy.notice_due(self._jobs[0].queued_at, self._sent().runs_out_at, self._engine.config)

    def _notify_waiting(self, head: PieceJob) -> None:
        ahead = self._engine.pool.ahead(head.future) if head.future is not None else None
        if ahead is None:
            return  # it has started meanwhile
        self._notified = True  # once per wait, even unsent: the driver must not retry at every wake-up
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
        """Wait for news, then take the head job's audio: (head, audio, done, error); `_ALL_DONE` once
        everything is delivered; `_NOTHING` to look again; None once cancelled. Sends a due `Waiting`."""
        with self._cond:
            due = self._notice_due()
            timeout = 1.0 if due is None else min(1.0, max(0.005, due - time.monotonic()))
            if self._after is not None:  # the stream before it says nothing when its text is cut: look
                timeout = min(timeout, self._engine.config.after_poll_s)
            self._cond.wait_for(self._has_news, timeout)
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
            due = self._notice_due()
        if not audio and not done:
            if due is not None and due <= time.monotonic():
                self._notify_waiting(head)
            return _NOTHING
        return head, audio, done, error

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
        it while its run goes on): hold it while the pieces after it (its own; once its text is all cut,
        those of the stream opened behind it for its listener, `_next`, which play once it has; or one
        more of `next_min_s` while text is still to come or likely, `_next_likely`) are predicted to come
        after its listener needs them (`policy.first_audio_late`, the rule in engine/listening.py
        `holds_first`). docs/scheduling.md tells why each part is there."""
        have = sum(pcm.size / rate for pcm, rate, _ in audio)
        start = time.monotonic()
        cfg = self._engine.config
        with self._cond:
            before_ends = self._sent().runs_out_at if self._before_counts() else None  # a continuation's, once
            if before_ends is not None and before_ends <= start:
                before_ends = None  # that audio has played: held as a new listener's
            self._held_s = have  # the pieces after it are cut and due by this audio's end
            if self._status is not StreamStatus.ENDED:  # cancelled meanwhile: the next look returns
                self._to(StreamStatus.HELD)
        rule = HoldRule(cfg.first_hold_s, cfg.hold_margin_s, cfg.hold_margin_s)
        engine, backend = self._engine, head.piece.voice.backend
        next_run_s = cfg.next_min_s * engine.rtf(backend) * (1 + engine.hold_error(backend))
        while True:
            self._fill(head)  # the look-ahead runs on while the first audio waits, on text that comes too
            late = self._hold_look(head, have, next_run_s)
            if late is None:
                return
            now = time.monotonic()
            if not holds_first(now, start, late, before_ends, rule):
                return
            until = policy.hold_until(start, before_ends, cfg)
            with self._cond:
                self._cond.wait(policy.next_look(late, now, until, cfg))

    def _hold_look(self, head: PieceJob, have: float, next_run_s: float) -> float | None:
        """One look of the hold: how late the latest piece after the first audio would come if it went
        now (None: cancelled). The pool's predictions are asked outside the stream's lock."""
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
            now = time.monotonic()
            def run_s(job: PieceJob) -> float:
                return self._run_s(job.piece) * (1 + errors[job.piece.voice.backend])

            pending = [PendingPiece(job.piece.seconds, run_s(job), start, job.audio_s if job.done else None,
                                    have if job is head else 0.0)
                       for (job, _, _), start in zip(after, starts, strict=True)]  # fmt: skip
            all_cut = self._all_cut()
            if all_cut:  # then its listener's next stream's, which play once it has
                pending += policy.following_pending(following, next_starts, self._engine.rtf, errors)
            more_text = not all_cut or not following_cut
            return policy.first_audio_late(now, self._sent().runs_out_at, pending, more_text, free_at, next_run_s)

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
                self._first_put_at = time.monotonic()
                if self._status is not StreamStatus.ENDED:
                    self._to(StreamStatus.PLAYING)
            self._frames_put = frames
            self._notified = False


_ALL_DONE = object()  # `_take_head`: every piece delivered, the text all in
_NOTHING = object()  # `_take_head`: nothing to deliver yet
