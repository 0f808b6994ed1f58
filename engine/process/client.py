"""`ProcessEngine`: the `Engine`/`Stream` contract (engine/types.py) over an engine in a child process.

One I/O thread per engine owns the zmq socket to the child, the child itself and its restarts: it sends
the commands the gateway queues (a bounded FIFO, so a stream's open, appends and finish arrive in order),
hands each stream's events to that stream (engine/process/stream.py) and each check's answer to the
verdicts (engine/process/verdicts.py), and watches the child's sentinel and heartbeat.

When the child dies (OOM, segfault, kill -9) or stops answering, every open stream ends at once with an
`error` (code `engine_restarting`), `state` says `restarting`, new streams are refused with
`engine_unavailable`, and the child is started again after a back-off (engine/process/supervisor.py).
A child that sends what cannot be read (a message that does not decode or cannot be handled, frames
out of their pairs) is broken as surely as a dead one: it is killed and restarted the same way, since a
lost `End` would leave its stream waiting with nothing to time it out. A child of another wire version
(`Hello`) is given up (`failed`): restarting would load the same code. Once the gateway is leaving
(`retire()`: it drains, then closes) no child is restarted. Every wait on the child has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Literal

import msgspec
import zmq

from engine.options import stream_request
from engine.process import wire
from engine.process.stream import ProcessStream, StreamMessage, event_of
from engine.process.supervisor import Backoff, Child
from engine.process.verdicts import UNAVAILABLE, Verdicts
from engine.types import (
    Capacity,
    EngineError,
    StreamRequest,
    VoiceInfo,
)

log = logging.getLogger("voxgate.engine.process")

State = Literal["warming", "ready", "restarting", "failed", "closed"]
RESTARTING = "engine_restarting"  # an open stream's end when its engine process died
MAX_OUTBOX = 50_000  # commands queued for the child and not yet on its socket
RECV_BATCH = 256  # messages read per wake-up before the thread looks at its timers again
# Plain ints: the I/O thread tests these per wake-up and per message, and zmq's enum.Flag operators are
# Python calls.
POLLIN, POLLOUT, EVENTS = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.EVENTS)
STREAM_MESSAGES = (wire.Audio, wire.Codec, wire.WordsMsg, wire.Wait)  # by far the most frequent: tested first


def _on_event_loop() -> bool:
    """Whether this thread runs an asyncio loop (which a wait for the child would hold)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ProcessEngine:
    """An engine (`load_engine(spec, **options)`) in a supervised child process.

    `state`: warming (first start) → ready ⇄ restarting (child died, back-off, warming again); failed
    (it cannot be loaded, or died `max_start_failures` times in a row before it was warm); closed.
    `last_error` says why it last went down. Static declarations (voices, languages, sample rate,
    capabilities) are the child's, read once it is warm; `capacity()`, `memory()` and `telemetry()` are its
    last heartbeat's."""

    def __init__(self, spec: str, options: dict[str, Any] | None = None, *, ready_timeout_s: float = 600.0,
                 hang_timeout_s: float = 15.0, backoff: Backoff | None = None, max_start_failures: int = 5) -> None:
        self.spec = spec
        self._options = dict(options or {})
        self._ready_timeout_s, self._hang_timeout_s = ready_timeout_s, hang_timeout_s
        self._backoff = backoff or Backoff()
        self._max_start_failures = max_start_failures
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._state: State = "warming"
        self._last_error: str | None = None
        self._info: wire.Info | None = None
        self._voices: tuple[VoiceInfo, ...] = ()
        self._failed_code = UNAVAILABLE  # a child that could not load says which code (model_unavailable, …)
        self._capacity: Capacity | None = None
        self._memory = wire.Memory()
        self._telemetry = wire.Telemetry()
        self._restarts = 0
        self._start_failures = 0
        self._streams: dict[int, ProcessStream] = {}
        self._sids = itertools.count(1)
        self._verdicts = Verdicts(spec, self._send)
        self._outbox: deque[list[bytes | memoryview]] = deque()
        self._woken = False
        self._closing = False
        self._retired = False  # the gateway is leaving: no more restarts
        self._broken: str | None = None  # why the current child must be given up (what it sent)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._ctx = zmq.Context()
        self._child: Child | None = None
        self._sock: zmq.Socket | None = None
        # The I/O thread's poller, kept while its socket and child are the same (a restart makes a new one).
        self._poller: zmq.Poller | None = None
        self._polled: tuple[zmq.Socket | None, Child | None] = (None, None)
        self._sock_flags = 0
        self._thread = threading.Thread(target=self._run, name=f"engine-client-{spec}", daemon=True)
        self._thread.start()

    # ---- what the gateway reads ----

    @property
    def state(self) -> State:
        return self._state

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.pid

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def warmup_s(self) -> float | None:
        return None if self._info is None else self._info.warmup_s

    def memory(self) -> dict[str, int | None]:
        """The child's last report (gateway/engine_report.py): its process's `pid`, `rss_bytes` and CUDA memory
        on a GPU, and what its engine holds (`weights_bytes`, `kv_bytes`, `slot_bytes`); None where unknown.
        Every field is given, so none is taken from the gateway's own process."""
        report: dict[str, int | None] = msgspec.structs.asdict(self._memory)
        report["pid"] = self.pid
        return report

    def telemetry(self) -> dict[str, float]:
        """The child engine's own measures from its last heartbeat (cycle time, batch size, queue depth, slots)."""
        return {k: v for k, v in msgspec.structs.asdict(self._telemetry).items() if v is not None}

    def _declared(self) -> wire.Info:
        info = self._info
        if info is None:
            raise EngineError(UNAVAILABLE, f"the engine {self.spec!r} is {self._state}")
        return info

    @property
    def sample_rate(self) -> int:
        return self._declared().sample_rate

    @property
    def supports_cloning(self) -> bool:
        return self._declared().supports_cloning

    def voices(self) -> list[VoiceInfo]:
        self._declared()
        return list(self._voices)

    def languages(self) -> list[str]:
        return list(self._declared().languages)

    def codec_info(self) -> dict[str, object] | None:
        info = self._declared().codec_info
        return None if info is None else dict(info)

    def capacity(self) -> Capacity | None:
        return self._capacity if self._state == "ready" else None

    # ---- the contract ----

    def _unavailable(self) -> EngineError:
        why = f": {self._last_error}" if self._last_error else ""
        code = self._failed_code if self._state == "failed" else UNAVAILABLE
        return EngineError(code, f"the engine {self.spec!r} is {self._state}{why}")

    def check(self, request: StreamRequest) -> None:
        """The child's `check`, answered from a cache when the same request was checked before (the
        declarations it judges by are static for one child); waits for the child at most CHECK_TIMEOUT_S:
        blocking, so the gateway calls it off its event loop."""
        if self._state != "ready":
            raise self._unavailable()
        self._judge(request, wait=True)

    def _judge(self, request: StreamRequest, *, wait: bool) -> None:
        """Raise the verdict on `request` when it is known (engine/process/verdicts.py)."""
        verdict = self._verdicts.judge(request, wait=wait)
        if verdict is not None and verdict[0]:
            raise EngineError(*verdict)

    def open_stream(self, voice: str | None, language: str, **options: object) -> ProcessStream:
        """Opens a stream in the child. The verdict on its request is raised here (EngineError) when it is
        known: cached (session.config checked the same request) or, off an event loop, asked of the child.
        On an event loop's thread a request not yet checked is never waited for (a busy or stopped child
        would hold every session for CHECK_TIMEOUT_S): the child's own open judges it, a refusal ends
        the stream with the engine's code (`StreamEnd("error", …, code)`), and its verdict is asked too,
        so the next open of that request is answered here."""
        if self._state != "ready":
            raise self._unavailable()
        request = stream_request(voice, language, options)
        self._judge(request, wait=not _on_event_loop())
        stream = ProcessStream(next(self._sids), self._declared().max_pending_chars, send=self._send,
                               forget=self._forget)
        with self._lock:
            if self._state != "ready":
                raise self._unavailable()
            self._streams[stream.sid] = stream
        self._send(wire.Open(stream.sid, request))
        return stream

    def close(self) -> None:
        """Stop the child (gracefully, then by force after 5 s) and end every open stream."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._set_state("closed", "the engine is closed")
        self._wake()
        self._thread.join(15.0)
        self._end_all("the engine is closed", "engine_closed")
        wake_r, wake_w, self._wake_w = self._wake_r, self._wake_w, -1  # a late _wake writes nowhere
        for fd in (wake_r, wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def retire(self) -> None:
        """The gateway is leaving (it drains, then closes this engine): a child that dies from now on is
        not restarted, nor is one whose restart is pending. The warm child keeps serving the streams
        that finish during the drain."""
        self._retired = True
        self._wake()

    # ---- readiness ----

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the engine is warm; raises its EngineError if it failed, `engine_unavailable` if
        `timeout_s` (default: the ready timeout) passes first."""
        timeout_s = self._ready_timeout_s if timeout_s is None else timeout_s
        with self._changed:
            self._changed.wait_for(lambda: self._state in ("ready", "failed", "closed"), timeout_s)
            if self._state != "ready":
                raise self._unavailable()

    async def ready(self, timeout_s: float | None = None) -> ProcessEngine:
        await asyncio.to_thread(self.wait_ready, timeout_s)
        return self

    # ---- the I/O thread's side ----

    def _send(self, msg: wire.Command) -> None:
        frames: list[bytes | memoryview] = [wire.command_encoder.encode(msg)]
        with self._lock:
            if len(self._outbox) >= MAX_OUTBOX:
                raise EngineError("queue_full", "the engine process is not taking commands")
            self._outbox.append(frames)
            wake = not self._woken
            self._woken = True
        if wake:
            self._wake()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    def _forget(self, sid: int) -> None:
        with self._lock:
            self._streams.pop(sid, None)

    def _set_state(self, state: State, error: str | None = None) -> None:
        with self._changed:
            if self._state == "closed" or (self._state == "failed" and state != "closed"):
                return
            self._state = state
            if error is not None:
                self._last_error = error
            self._changed.notify_all()

    def _end_all(self, message: str, code: str) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
            self._outbox.clear()
        for stream in streams:
            stream.end("error", message, code)
        self._verdicts.release()

    def _spawn(self) -> None:
        child = Child(self.spec, self._options)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, wire.HWM)
        sock.setsockopt(zmq.RCVHWM, wire.HWM)
        sock.bind(child.address)
        self._sock, self._child = sock, child
        child.start()
        self._heard_at = time.monotonic()
        log.info("engine %r: started its process (pid %s)", self.spec, child.pid)

    def _run(self) -> None:
        restart_at: float | None = time.monotonic()
        try:
            while not self._closing:
                now = time.monotonic()
                if self._child is None and restart_at is not None and self._retired:
                    restart_at = None
                    self._set_state("closed", "not restarted: the gateway is shutting down")
                if self._child is None and restart_at is not None and now >= restart_at:
                    restart_at = None
                    try:
                        self._spawn()
                    except Exception as e:  # cannot even start a process: say so, try again later
                        log.exception("engine %r: its process could not be started", self.spec)
                        restart_at = self._went_down(f"the engine process could not be started ({e})", warm=None)
                wait_s = 0.5 if restart_at is None else max(0.0, min(0.5, restart_at - now))
                self._cycle(wait_s)
                if self._child is not None and (reason := self._gone_or_stuck()) is not None:
                    restart_at = self._died(reason)
        except Exception:  # never leave streams waiting on a thread that is gone
            log.exception("engine %r: its I/O thread failed", self.spec)
            self._set_state("failed", "the engine's I/O thread failed")
        finally:
            self._shutdown()

    def _poller_for(self, sock: zmq.Socket | None, child: Child | None) -> zmq.Poller:
        """The poller of this socket and child: built once per child, not once per wake-up."""
        poller = self._poller
        if poller is None or self._polled[0] is not sock or self._polled[1] is not child:
            poller = zmq.Poller()
            poller.register(self._wake_r, POLLIN)
            if sock is not None:
                poller.register(sock, POLLIN)
            if child is not None:
                poller.register(child.sentinel, POLLIN)
            self._poller, self._polled, self._sock_flags = poller, (sock, child), POLLIN
        return poller

    def _cycle(self, wait_s: float) -> None:
        sock, child = self._sock, self._child
        poller = self._poller_for(sock, child)
        if sock is not None:
            flags = POLLIN | (POLLOUT if self._outbox else 0)
            if flags != self._sock_flags:  # POLLOUT only while commands wait for room
                poller.register(sock, flags)
                self._sock_flags = flags
        ready = dict(poller.poll(wait_s * 1000))
        if self._wake_r in ready:
            with self._lock:
                self._woken = False
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        if sock is not None:
            if ready.get(sock, 0) & POLLIN:
                self._receive(sock)
            self._flush(sock)

    def _flush(self, sock: zmq.Socket) -> None:
        if not self._outbox:  # most wake-ups bring messages and no command; a command put meanwhile wakes us again
            return
        while True:
            with self._lock:
                if not self._outbox:
                    return
                frames = self._outbox[0]
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                return  # the child's queue is full: POLLOUT says when it has room
            with self._lock:
                if self._outbox and self._outbox[0] is frames:
                    self._outbox.popleft()

    def _receive(self, sock: zmq.Socket) -> None:
        # The poll said a message is there; each further one is asked of ZMQ_EVENTS (under the GIL) rather
        # than by a receive that fails: every receive lets go of the GIL, and each let-go while the event
        # loop waits for it is a hand-over between the threads (most of this thread's cost is those and its
        # wake-ups, not the messages: bench/results/capacity_s26.md, capacity_s28.md).
        heard = False
        for _ in range(RECV_BATCH):
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            heard = True
            if len(frames) % 2:
                self._broke(f"a message of {len(frames)} frames, not (header, payload) pairs")
            for at in range(0, len(frames) - 1, 2):  # the others still count: an End among them ends its stream
                self._take(frames[at], frames[at + 1])
            if not sock.getsockopt(EVENTS) & POLLIN:
                break
        if heard:
            self._heard_at = time.monotonic()  # once per batch: the hang check reads it in seconds

    def _take(self, header: bytes, payload: bytes) -> None:
        try:
            msg = wire.event_decoder.decode(header)
        except Exception as e:
            self._broke(f"a message that does not decode ({type(e).__name__}: {e})")
            return
        try:
            self._dispatch(msg, payload)
        except Exception as e:  # what it sent cannot be handled (a payload that does not fit its header, …)
            log.exception("engine %r: a %s from its process could not be handled", self.spec, type(msg).__name__)
            self._broke(f"a {type(msg).__name__} that could not be handled ({type(e).__name__})")

    def _broke(self, what: str) -> None:
        """The child sent something unreadable: it is given up (killed, restarted: `_gone_or_stuck`), since a
        message lost could be a stream's `End`, and nothing else would ever end that stream."""
        if self._broken is None:
            pid = None if self._child is None else self._child.pid
            self._broken = f"the engine process (pid {pid}) sent {what}"
            log.error("engine %r: %s; it is killed", self.spec, self._broken)

    def _dispatch(self, msg: wire.Event, payload: bytes) -> None:
        if isinstance(msg, STREAM_MESSAGES):
            self._deliver(msg, payload)
        elif isinstance(msg, wire.Hello):
            if msg.version != wire.VERSION:
                self._mismatch(msg)
        elif isinstance(msg, wire.Beat):
            self._memory, self._telemetry = msg.memory, msg.telemetry
            self._capacity = None if msg.capacity is None else Capacity(*msg.capacity)
        elif isinstance(msg, wire.End | wire.Refused):
            self._ended(msg)
        elif isinstance(msg, wire.Checked):
            self._verdicts.answered(msg)
        elif isinstance(msg, wire.Ready):
            self._ready(msg.info)
        elif isinstance(msg, wire.Failed):
            self._load_failed(msg)

    def _ended(self, msg: wire.End | wire.Refused) -> None:
        with self._lock:
            stream = self._streams.pop(msg.sid, None)
        if stream is None:
            return
        if isinstance(msg, wire.End):
            stream.end(msg.reason, msg.message, msg.code)
            return
        # Refused: the child refused text the parent let through: the stream cannot speak all it was given,
        # so it ends with an error naming the unspoken segments (never a silent gap).
        stream.end("error", msg.message, msg.code)
        self._send(wire.Cancel(msg.sid))

    def _load_failed(self, msg: wire.Failed) -> None:
        with self._changed:
            self._state, self._last_error, self._failed_code = "failed", msg.message, msg.code
            self._changed.notify_all()
        log.error("engine %r failed to load: %s", self.spec, msg.message)

    def _deliver(self, msg: StreamMessage, payload: bytes) -> None:
        """A stream's event from the child, to its consumer; one past the credit window ends the stream."""
        stream = self._streams.get(msg.sid)
        if stream is None:
            return  # cancelled here: its last events are still on their way
        if not stream.put(event_of(msg, payload)):
            self._forget(msg.sid)
            stream.end("error", "the engine process sent past its stream's window", "engine_error")
            self._send(wire.Cancel(msg.sid))

    def _mismatch(self, hello: wire.Hello) -> None:
        """A child of another wire version (the code on disk changed under this gateway): given up, failed."""
        message = (f"the engine process (pid {hello.pid}) speaks engine wire version {hello.version}, this gateway "
                   f"{wire.VERSION}: the code on disk changed under a running gateway; restart the gateway")
        with self._changed:
            self._state, self._last_error, self._failed_code = "failed", message, UNAVAILABLE
            self._changed.notify_all()
        log.error("engine %r: %s", self.spec, message)
        self._broken = message  # _gone_or_stuck kills it; _died does not restart a failed engine

    def _ready(self, info: wire.Info) -> None:
        assert self._child is not None
        self._child.ready_at = time.monotonic()
        self._start_failures = 0
        voices = tuple(VoiceInfo(v.name, v.languages, v.kind, v.description, dict(v.extra))  # type: ignore[arg-type]
                       for v in info.voices)
        with self._lock:
            self._info, self._voices = info, voices
            self._verdicts.clear()
        self._set_state("ready")
        log.info("engine %r ready in its process (pid %d, warm-up %.1f s)", self.spec, info.pid, info.warmup_s)

    def _gone_or_stuck(self) -> str | None:
        """Why the child must be given up (None: it is fine)."""
        child = self._child
        assert child is not None
        if not child.process.is_alive():
            return child.exit_reason()
        if self._broken is not None:
            child.kill()
            return self._broken
        now = time.monotonic()
        if child.ready_at is not None and now - self._heard_at > self._hang_timeout_s:
            child.kill()
            return f"the engine process (pid {child.pid}) sent nothing for {self._hang_timeout_s:g} s"
        if child.ready_at is None and self._state != "failed" and now - child.started_at > self._ready_timeout_s:
            child.kill()
            return f"the engine process (pid {child.pid}) was not warm after {self._ready_timeout_s:g} s"
        return None

    def _died(self, reason: str) -> float | None:
        child, sock = self._child, self._sock
        assert child is not None and sock is not None
        warm = None if child.ready_at is None else time.monotonic() - child.ready_at
        self._child, self._sock, self._capacity, self._broken = None, None, None, None
        self._memory, self._telemetry = wire.Memory(), wire.Telemetry()  # the dead child's numbers are not news
        sock.close(linger=0)
        child.reap(1.0)
        if self._state == "failed":  # it said why it could not load: restarting would not help
            self._end_all(self._last_error or "the engine failed", UNAVAILABLE)
            return None
        log.error("engine %r: %s", self.spec, reason)
        restart_at = self._went_down(reason, warm)  # the state first: a stream's end may be read at once
        then = "the gateway is shutting down: it is not restarted" if self._retired else "the engine is restarting"
        self._end_all(f"{reason}; {then}", RESTARTING)
        return restart_at

    def _went_down(self, reason: str, warm: float | None) -> float | None:
        """The restart's time (None: no more restarts)."""
        if self._retired:
            self._set_state("closed", f"{reason}; not restarted: the gateway is shutting down")
            log.warning("engine %r: not restarted: the gateway is shutting down", self.spec)
            return None
        if warm is None:
            self._start_failures += 1
            if self._start_failures >= self._max_start_failures:
                self._set_state("failed", f"{reason} ({self._start_failures} starts in a row failed)")
                return None
        self._restarts += 1
        self._set_state("restarting", reason)
        delay = self._backoff.died(warm)
        log.warning("engine %r: restart %d in %.1f s", self.spec, self._restarts, delay)
        return time.monotonic() + delay

    def _shutdown(self) -> None:
        child, sock = self._child, self._sock
        if sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.send_multipart([wire.command_encoder.encode(wire.Close())], flags=zmq.NOBLOCK)
        if child is not None:  # a warm child closes its engine; one still loading has nothing to save
            child.reap(5.0 if child.ready_at is not None else 0.0)
        if sock is not None:
            sock.close(linger=0)
        self._child, self._sock = None, None
        self._ctx.term()

    def __repr__(self) -> str:
        return f"ProcessEngine({self.spec!r}, state={self._state}, pid={self.pid})"


def start_engine(spec: str, *, ready_timeout_s: float = 600.0, hang_timeout_s: float = 15.0,
                 **options: Any) -> ProcessEngine:
    """Start `load_engine(spec, **options)` in a supervised child process; returns at once (state
    `warming`): `await engine.ready()` or `engine.wait_ready()` for it to be warm."""
    return ProcessEngine(spec, options, ready_timeout_s=ready_timeout_s, hang_timeout_s=hang_timeout_s)
