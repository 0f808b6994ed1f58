"""A CPU stream's pool jobs, on the workers: each piece's synthesis (`run_piece`), a run that gives its
worker up to a more urgent job (`yield_worker`), a job over (`_job_over`). The worker side of
engine/cpu/stream.py's `CpuStream`, which derives from it: the same lock and state, kept apart so each
module reads as one side (the driver's, the workers')."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from engine.cpu.espeak import Pinned
from engine.cpu.jobs import Piece, PieceJob
from engine.cpu.pool import Preempted
from engine.cpu.stream_host import StreamHost, StreamLock
from engine.types import EngineError

log = logging.getLogger("voxgate.engine.cpu")


class StreamRuns:
    """The worker side of a stream. `CpuStream` sets these in its constructor."""

    _engine: StreamHost
    _clock: Callable[[], float]
    _cond: StreamLock
    _cancelled: threading.Event
    _speed: float
    _pinned: Pinned | None

    def _run_s(self, piece: Piece) -> float:
        """How long `piece` is expected to run: its estimated length × its backend's measured RTF."""
        return piece.seconds * self._engine.rtf(piece.voice.backend)

    def run_piece(self, job: PieceJob) -> None:
        """A pool job's body, on a worker: `job`'s synthesis, its audio handed to the driver as it comes."""
        with self._cond:
            job.started_at = self._clock()
            if job.preempted:  # it gave its worker up before: it runs again, whole
                job.preempted, job.run_options.terminate = False, False
            self._cond.notify_all()  # a held first audio's prediction takes its start
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
