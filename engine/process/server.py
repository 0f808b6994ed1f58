"""The engine process: `load_engine(spec)` in a child of the gateway, served over one zmq socket.

It runs an asyncio loop that only relays: commands from the gateway become calls on the engine and its
streams, each stream's events go back as they come — no faster than the gateway's consumer takes them
(the credit window, engine/process/wire.py): a stream whose window is spent is not read, so its engine
bridge fills and the engine stops making its audio, as in-process. The torch / onnxruntime work runs in
the engine's own threads, on this process's GIL, never the gateway's.

It lives no longer than its parent: once the parent is gone (re-parented), it exits. It ignores SIGTERM
and SIGINT (`main`): when it stops is the gateway's to decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from engine import heap
from engine.process import wire
from engine.types import (
    AudioChunk,
    CodecFrames,
    Engine,
    EngineError,
    Stream,
    StreamEnd,
    StreamRequest,
    Waiting,
    Words,
)

log = logging.getLogger("voxgate.engine.process")


class _Window:
    """A stream's credit: how many more events it may send before the parent has consumed some."""

    def __init__(self) -> None:
        self.left = wire.WINDOW
        self.open = asyncio.Event()
        self.open.set()

    def give(self, n: int) -> None:
        self.left += n
        if self.left > 0:
            self.open.set()

    async def take(self) -> None:
        while self.left <= 0:
            self.open.clear()
            await self.open.wait()
        self.left -= 1


# One awaited zmq send per event instead of a batch: bench/engine_bench.py --relay-compare measures the
# batched relay against it; nothing else sets this.
PER_EVENT = os.environ.get("VOXGATE_ENGINE_RELAY") == "per_event"


class _Outbox:
    """The child's messages to the gateway, in as few zmq messages as there are event-loop iterations:
    everything posted in one iteration (the relays' events of one engine cycle, a heartbeat, an answer)
    leaves at its end in one multipart message (wire.py: header, payload, header, …) by one non-blocking
    send, instead of one awaited send per event (each a future, a wake-up of zmq's I/O thread and of the
    gateway's). At most `wire.MAX_BATCH` messages go in one. Bounded: audio by each stream's credit
    window, the rest by the commands asking for it; should the gateway's socket be full, what is posted
    waits for room in order (and heartbeats are skipped meanwhile)."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self._sock = sock
        self._frames: list[bytes] = []
        self._count = 0
        self._scheduled = False
        self._blocked: asyncio.Task[None] | None = None

    @property
    def blocked(self) -> bool:
        return self._blocked is not None

    def post(self, msg: wire.Event, payload: bytes | None = None) -> None:
        self._frames.append(wire.event_encoder.encode(msg))
        self._frames.append(wire.NO_PAYLOAD if payload is None else payload)
        self._count += 1
        if self._count >= wire.MAX_BATCH:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._frames or self._blocked is not None:
            return
        frames, self._frames, self._count = self._frames, [], 0
        # NOBLOCK: pyzmq sends at once and hands back a finished future, and wakes a receive waiting on the
        # same socket (a send on a plain twin of it would eat the edge-triggered wake-up a waiting recv needs:
        # the child then hears no more commands — it did).
        sent = self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
        if isinstance(sent.exception(), zmq.Again):  # the gateway's queue is full (HWM): wait for room, in order
            self._blocked = asyncio.create_task(self._send_when_room(frames))
        elif sent.exception() is not None:
            raise sent.exception()  # type: ignore[misc]

    async def _send_when_room(self, frames: list[bytes]) -> None:
        try:
            await self._sock.send_multipart(frames)
        finally:
            self._blocked = None
        self.flush()


class EngineServer:
    def __init__(self, sock: zmq.asyncio.Socket, engine: Engine) -> None:
        self.sock, self.engine = sock, engine
        self.outbox = _Outbox(sock)
        self.streams: dict[int, tuple[Stream, _Window]] = {}
        self.relays: set[asyncio.Task[None]] = set()
        self._held: dict[str, int] | None = None  # the engine's own memory(), asked every MEMORY_EVERY_S
        self._held_at = 0.0

    async def send(self, msg: wire.Event, payload: bytes | None = None) -> None:
        """Posted, never waited for (_Outbox); `await`ed only for the per-event relay the bench compares."""
        if PER_EVENT:
            header = wire.event_encoder.encode(msg)
            await self.sock.send_multipart([header, wire.NO_PAYLOAD if payload is None else payload])
        else:
            self.outbox.post(msg, payload)

    async def serve(self) -> bool:
        """Commands until `Close` (True), or until one cannot be read (False: the process exits with
        `wire.EXIT_UNREADABLE`, so the gateway restarts it and ends every stream: a lost `Finish` or
        `Cancel` would otherwise leave its stream open for good)."""
        while True:
            frames = await self.sock.recv_multipart()
            try:
                cmd = wire.command_decoder.decode(frames[0])
            except Exception:
                log.exception("a command from the gateway does not decode: this process exits")
                return False
            if isinstance(cmd, wire.Close):
                return True
            try:
                await self.handle(cmd)
            except Exception as e:  # its stream cannot go on as asked: it ends with an error, never hangs
                log.exception("command %s failed", type(cmd).__name__)
                await self.fail(getattr(cmd, "sid", None), f"the engine could not {type(cmd).__name__.lower()} "
                                f"the stream ({type(e).__name__})")  # fmt: skip

    async def fail(self, sid: int | None, message: str) -> None:
        """End stream `sid` with an error (its relay, if any, is cancelled first: one End per stream)."""
        if sid is None:
            return
        entry = self.streams.pop(sid, None)
        if entry is not None:
            with contextlib.suppress(Exception):
                entry[0].cancel()
            for task in list(self.relays):
                if task.get_name() == f"relay-{sid}":
                    task.cancel()
        await self.send(wire.End(sid, "error", message, "engine_error"))

    async def handle(self, cmd: wire.Command) -> None:
        if isinstance(cmd, wire.Check):
            code, message = _check(self.engine, cmd.request)
            await self.send(wire.Checked(cmd.rid, code, message))
        elif isinstance(cmd, wire.Open):
            try:
                stream = self.engine.open_stream(cmd.request.voice, cmd.request.language, **cmd.request.options())
            except EngineError as e:
                await self.send(wire.End(cmd.sid, "error", str(e), e.code))
                return
            window = _Window()
            self.streams[cmd.sid] = (stream, window)
            task = asyncio.create_task(self.relay(cmd.sid, stream, window), name=f"relay-{cmd.sid}")
            self.relays.add(task)
            task.add_done_callback(self.relays.discard)
        elif (entry := self.streams.get(getattr(cmd, "sid", -1))) is not None:
            stream, window = entry
            if isinstance(cmd, wire.Append):
                try:
                    stream.append(cmd.text)
                except EngineError as e:
                    await self.send(wire.Refused(cmd.sid, e.code, str(e)))
            elif isinstance(cmd, wire.Finish):
                stream.finish()
            elif isinstance(cmd, wire.Credit):
                window.give(cmd.n)
            elif isinstance(cmd, wire.Cancel):
                stream.cancel()  # the engine frees its slot before its next cycle
                window.give(wire.WINDOW)  # a relay waiting for credit reads on to the end

    async def relay(self, sid: int, stream: Stream, window: _Window) -> None:
        events = stream.events()
        end = StreamEnd("error", "the engine stream ended without an end")
        try:
            while True:
                await window.take()
                ev = await anext(events, None)
                if ev is None:
                    break
                if isinstance(ev, StreamEnd):
                    end = ev
                    break
                if isinstance(ev, AudioChunk):
                    pcm = np.ascontiguousarray(ev.pcm, dtype=np.int16).tobytes()  # sent later: a copy
                    await self.send(wire.Audio(sid, ev.sample_rate, ev.first_frame, ev.segment), pcm)
                elif isinstance(ev, CodecFrames):
                    codes = np.ascontiguousarray(ev.codes, dtype=np.int16)
                    await self.send(wire.Codec(sid, ev.first_frame, ev.segment, ev.prime, codes.shape[1]),
                                    codes.tobytes())
                elif isinstance(ev, Words):
                    words = [(w.word, w.start, w.end) for w in ev.words]
                    await self.send(wire.WordsMsg(sid, ev.segment, ev.sample_rate, words, ev.estimated))
                elif isinstance(ev, Waiting):
                    await self.send(wire.Wait(sid, ev.reason, ev.ahead))
                else:  # an event this transport does not know yet: said, never silently lost
                    raise TypeError(f"no wire message for {type(ev).__name__}")
        except Exception as e:  # the stream's own failure ends it, never the process
            log.exception("stream %d failed", sid)
            end = StreamEnd("error", f"the engine stream failed ({type(e).__name__})")
            stream.cancel()
        finally:
            self.streams.pop(sid, None)
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        await self.send(wire.End(sid, end.reason, end.message, getattr(end, "code", "")))
        await self.send_beat()  # a stream's end changes the capacity: admission hears it now, not next beat

    async def send_beat(self) -> None:
        capacity = None
        probe = getattr(self.engine, "capacity", None)
        if probe is not None:
            with contextlib.suppress(Exception):  # advice only: a failing probe says "cannot tell"
                if (c := probe()) is not None:
                    capacity = (c.streams, c.active, c.busy_s, c.workers, c.follows_listener, c.budget, c.costs,
                                c.voice_costs, c.behind_s, c.first_audio_s, c.language_classes,
                                c.voice_classes)
        if self.outbox.blocked:  # the gateway is not reading: a beat would only queue behind the rest
            return
        now = time.monotonic()
        if self._held is None or now - self._held_at >= wire.MEMORY_EVERY_S:
            self._held, self._held_at = _numbers(_asked(self.engine, "memory"), wire.Memory.__struct_fields__, int), now
        await self.send(wire.Beat(capacity, memory(self._held), telemetry(self.engine)))

    async def beat(self) -> None:
        while True:
            await self.send_beat()
            await asyncio.sleep(wire.BEAT_S)


def _check(engine: Engine, request: StreamRequest) -> tuple[str, str]:
    try:
        engine.check(request)
    except EngineError as e:
        return e.code, str(e)
    except Exception as e:
        log.exception("check failed")
        return "invalid_option", f"the engine could not check the request ({type(e).__name__})"
    return "", ""


def _asked(engine: Engine | None, method: str) -> dict[str, Any]:
    """`engine.memory()` / `engine.telemetry()` where it has one ({} where not, or where it fails: a report
    must not take the heartbeat down)."""
    probe = getattr(engine, method, None)
    if probe is None:
        return {}
    try:
        found = probe()
    except Exception:
        log.exception("engine.%s() failed", method)
        return {}
    return found if isinstance(found, dict) else {}


def _numbers(found: dict[str, Any], fields: tuple[str, ...], kind: type) -> dict[str, Any]:
    """The known fields that are numbers (a bool is not one), as `kind`: what else an engine says stays here."""
    return {k: kind(v) for k, v in found.items()
            if k in fields and isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip


def memory(held: dict[str, int] | None = None) -> wire.Memory:
    """This process's resident memory and torch's CUDA memory when it holds a GPU (read at every beat: a
    file read), and `held`: what the engine says it holds (its `memory()`: weights, KV and slot bytes)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError), open("/proc/self/statm") as f:
        out["rss_bytes"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_allocated_bytes"] = out["torch_allocated_bytes"] = int(torch.cuda.memory_allocated())
        out["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved())
    return wire.Memory(**{**out, **(held or {})})


def telemetry(engine: Engine) -> wire.Telemetry:
    """The engine's own measures (its `telemetry()`: cycle time, batch size, queue depth, slots)."""
    return wire.Telemetry(**_numbers(_asked(engine, "telemetry"), wire.Telemetry.__struct_fields__, float))


def info(engine: Engine, warmup_s: float) -> wire.Info:
    voices = [wire.Voice(v.name, tuple(v.languages), v.kind, v.description, dict(v.extra)) for v in engine.voices()]
    pending = getattr(engine, "max_pending_chars", None)
    if pending is None:
        pending = getattr(getattr(engine, "config", None), "max_pending_chars", None)
    return wire.Info(os.getpid(), int(engine.sample_rate), bool(engine.supports_cloning), voices,
                     list(engine.languages()), engine.codec_info(), pending, hasattr(engine, "capacity"),
                     warmup_s)  # fmt: skip


async def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    log.warning("the gateway (pid %d) is gone; the engine process exits", parent)
    os._exit(0)


async def _main(spec: str, options: dict[str, Any], address: str, parent: int) -> int:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, wire.HWM)
    sock.setsockopt(zmq.RCVHWM, wire.HWM)
    sock.connect(address)
    watcher = asyncio.create_task(_watch_parent(parent))
    await sock.send_multipart([wire.event_encoder.encode(wire.Hello(wire.VERSION, os.getpid())), wire.NO_PAYLOAD])
    from engine.loader import load_engine

    started = time.monotonic()
    try:
        engine = await asyncio.to_thread(load_engine, spec, **options)
    except Exception as e:
        code = e.code if isinstance(e, EngineError) else "model_unavailable"
        log.exception("engine %r failed to load", spec)
        failed = wire.Failed(code, f"{type(e).__name__}: {e}")
        await sock.send_multipart([wire.event_encoder.encode(failed), wire.NO_PAYLOAD])
        await asyncio.sleep(0.2)  # LINGER 0: give the message its moment on the wire
        return 0
    heap.settle(collect=True)  # nothing is served yet: the engine's heap leaves the full GC passes
    server = EngineServer(sock, engine)
    await server.send(wire.Ready(info(engine, time.monotonic() - started)))
    beat = asyncio.create_task(server.beat())
    clean = False
    try:
        clean = await server.serve()
    finally:
        beat.cancel()
        watcher.cancel()
        for task in list(server.relays):
            task.cancel()
        await asyncio.to_thread(engine.close)
        sock.close()
        ctx.term()
    return 0 if clean else wire.EXIT_UNREADABLE


def main(spec: str, options: dict[str, Any], address: str, parent: int) -> None:
    """The child's entry point (multiprocessing, spawn start method).

    SIGTERM and SIGINT are ignored: the gateway alone decides when its engines stop. A signal to the
    whole process group (systemd's default KillMode, `tini -g`, Ctrl-C, `kill -- -PGID`) reaches this
    process too, and must not cut the utterances the gateway is draining. The child still ends: on
    `Close`, when its parent is gone (`_watch_parent`), or by SIGKILL from the parent after a timeout."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s engine[{os.getpid()}] %(levelname)s %(message)s")
    status = asyncio.run(_main(spec, options, address, parent))
    # The engine is closed and the socket too: nothing is left to save, and an interpreter shutdown can
    # wait seconds on threads that libraries leave behind (it did with the Qwen3 core's).
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":  # started by multiprocessing's spawn: nothing runs on import
    sys.exit("engine/process/server.py is started by engine.process.start_engine, not run directly")
