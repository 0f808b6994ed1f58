"""The per-chunk and per-renewal parts session 24 changed, old way against new, in one process: CPU time per
operation (`time.process_time`), the two ways interleaved round by round, medians and their ratio.

On a shared two-core box whose load drifts by minutes, `bench/capacity.py` cannot resolve a change of a few
per cent in the gateway's CPU per audio-second; an operation timed a hundred thousand times, old and new in
turn within the same second, can. Multiply by how often each runs (per audio frame: 5 per audio-second at
the synthetic engine's 0.2 s chunks; per lease renewal: 1/5 s per session) for its share of the total.

    python bench/capacity_parts.py [--rounds 7] [--out bench/results/capacity_parts_s24]

Parts:
- `bridge`: an engine-process stream's event into its bridge: `EventBridge.put(ev, timeout=0)` (a
  Condition wait) against `EventBridge.offer(ev)`;
- `drain` (session 28): the engine client's I/O thread per wake-up with one message: it, then a receive
  that fails (`zmq.Again`), against it, then ZMQ_EVENTS asked (the send to it is in both);
- `poller`: the engine client's I/O thread per wake-up: a zmq.Poller built and registered (3 fds) and
  polled, against one kept and polled;
- `send`: an audio frame to the ASGI send through Litestar's `send_bytes` (→ `send_data` → the state
  check), against the `websocket.send` event to the state-checking send directly;
- `counter`: `voxgate_audio_bytes_total` per frame: prometheus_client's `Counter.inc` (a lock) against the
  loop-thread counter;
- `tick`: one open utterance's idle-commit check per wake-up, 256 sockets at once: each its own
  `asyncio.sleep(poll_interval)` against all waiting on the process's one `Ticker` (gateway/ticker.py);
- `idle`: a socket between turns, per wake-up of its poller: the 1 s backstop (`asyncio.timeout` around an
  `Event.wait` that times out) against none (it waits on the event alone, no timer: the new cost is the
  loop's bookkeeping of a pending wait, nothing per second) — multiply the old by 1/s per idle socket;
- `deadline`: one `with Deadline` around an await (the writer's per frame, the reader's per message): with
  the one-task check (`asyncio.current_task()`) per `with` (a subclass adding it back) against without it
  (now only in asyncio debug mode and where an await expires);
- `record`: one utterance record written behind against a real redis-server: its own acknowledged script
  call through the breaker (`record_utterance`), against its share of one pipeline of 64 (`_write_batch`);
- `piece`: the per-piece work `input.text` no longer does: the refusal message made on every admit (`quote`
  of the text), the segmenter's pending text copied to take its length (~200 characters pending), and an
  empty `commit` coroutine awaited for a piece that ended no segment; against their replacements (the
  message made only for a refusal, `pending_chars`, no call);
- `renewal`: one lease renewal against a real redis-server: its own EVALSHA call through the breaker (the
  old per-lease keep-alive), against its share of one pipeline of 64 (`Renewals`);
- session 28's (bench/capacity_parts_ws.py): `wsread` (a word piece through the WebSocket protocol's read
  and the app's receive), uvicorn's websockets-sansio protocol against the gateway's `ReadAhead`;
- session 25's (bench/capacity_parts_session.py): `admission` (one utterance's admission and release at 256
  streams in flight), `chain` (one audio event through the stream layers), and the steps of a text piece
  alone, with no old/new (`decode`, `feed`, `admit`). bench/capacity_paths.py times the paths whole.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import zmq  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from bench import capacity_parts_session as session  # noqa: E402
from bench import capacity_parts_ws as ws  # noqa: E402
from engine.stream import EventBridge  # noqa: E402
from engine.types import AudioChunk  # noqa: E402
from gateway.metrics import _LoopCounter  # noqa: E402

Timed = Callable[[int], None]


def cpu_us(fn: Timed, n: int) -> float:
    t0 = time.process_time()
    fn(n)
    return (time.process_time() - t0) / n * 1e6


def bridge_parts() -> tuple[Timed, Timed]:
    ev = AudioChunk(np.zeros(4800, np.int16), 24000, 0, 0)

    def old(n: int) -> None:
        b = EventBridge(n + 1)
        for _ in range(n):
            b.put(ev, timeout=0)

    def new(n: int) -> None:
        b = EventBridge(n + 1)
        for _ in range(n):
            b.offer(ev)

    return old, new


def poller_parts() -> tuple[Timed, Timed]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.bind("inproc://parts")
    r1, _ = os.pipe()
    r2, _ = os.pipe()
    pin, pout = int(zmq.POLLIN), int(zmq.POLLOUT)
    kept = zmq.Poller()
    for fd in (r1, sock, r2):
        kept.register(fd, pin)

    def old(n: int) -> None:
        for _ in range(n):
            p = zmq.Poller()
            p.register(r1, zmq.POLLIN)
            p.register(sock, zmq.POLLIN | (zmq.POLLOUT if False else 0))
            p.register(r2, zmq.POLLIN)
            dict(p.poll(0))

    def new(n: int) -> None:
        flags = pin
        for _ in range(n):
            if (pin | (pout if False else 0)) != flags:
                kept.register(sock, flags)
            dict(kept.poll(0))

    return old, new


def drain_parts() -> tuple[Timed, Timed]:
    """The engine client's I/O thread per wake-up with one message waiting (as at 256 sessions of the
    synthetic engine): the message, then a receive that fails (`zmq.Again`), against the message, then
    ZMQ_EVENTS asked (session 28). The receive lets go of the GIL, the ask does not."""
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    a.bind("inproc://drain")
    b.connect("inproc://drain")
    message = [b"h" * 40, b"\0" * 9600]
    events, pin = int(zmq.EVENTS), int(zmq.POLLIN)

    def old(n: int) -> None:
        for _ in range(n):
            b.send_multipart(message)
            a.recv_multipart(flags=zmq.NOBLOCK)
            with contextlib.suppress(zmq.Again):  # what the old loop ended every wake-up with
                a.recv_multipart(flags=zmq.NOBLOCK)

    def new(n: int) -> None:
        for _ in range(n):
            b.send_multipart(message)
            a.recv_multipart(flags=zmq.NOBLOCK)
            a.getsockopt(events) & pin

    return old, new


def send_parts() -> tuple[Timed, Timed]:
    from litestar.connection import WebSocket

    async def asgi_send(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "websocket.receive"}

    scope: Any = {"type": "websocket", "path": "/", "headers": [], "query_string": b"", "state": {}, "app": None,
                  "litestar_app": None, "path_params": {}, "root_path": "", "scheme": "ws"}  # fmt: skip
    ws = WebSocket(scope, receive, asgi_send)
    ws.connection_state = "connect"
    frame = b"\0" * 9600
    send = ws.send
    loop = asyncio.new_event_loop()

    async def old_many(n: int) -> None:
        for _ in range(n):
            await ws.send_bytes(frame)

    async def new_many(n: int) -> None:
        for _ in range(n):
            await send({"type": "websocket.send", "bytes": frame, "text": None})

    return (lambda n: loop.run_until_complete(old_many(n))), (lambda n: loop.run_until_complete(new_many(n)))


def counter_parts() -> tuple[Timed, Timed]:
    old_c = Counter("parts_bytes_total", "x", registry=CollectorRegistry())
    new_c = _LoopCounter("parts_bytes_total", "x")

    def old(n: int) -> None:
        for _ in range(n):
            old_c.inc(9600)

    def new(n: int) -> None:
        for _ in range(n):
            new_c.inc(9600)

    return old, new


def tick_parts() -> tuple[Timed, Timed]:
    from gateway.ticker import Ticker

    sockets, interval = 256, 1e-4
    loop = asyncio.new_event_loop()
    ticker = Ticker(interval, loop)

    async def own(k: int) -> None:
        for _ in range(k):
            await asyncio.sleep(interval)

    async def shared(k: int) -> None:
        for _ in range(k):
            await ticker.wait()

    def run(one: Callable[[int], Awaitable[None]]) -> Timed:
        async def many(n: int) -> None:
            await asyncio.gather(*(one(max(1, n // sockets)) for _ in range(sockets)))

        return lambda n: loop.run_until_complete(many(n))

    return run(own), run(shared)


def idle_parts() -> tuple[Timed, Timed]:
    import contextlib

    loop = asyncio.new_event_loop()
    event = asyncio.Event()

    async def backstop(n: int) -> None:
        for _ in range(n):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0):
                    await event.wait()

    async def none(n: int) -> None:
        for _ in range(n):
            pass

    return (lambda n: loop.run_until_complete(backstop(n))), (lambda n: loop.run_until_complete(none(n)))


def deadline_parts() -> tuple[Timed, Timed]:
    from gateway.deadline import Deadline

    class Checked(Deadline):
        def __enter__(self) -> Deadline:
            if self._task is not None:
                assert self._task is asyncio.current_task(), "a Deadline bounds one task's awaits"
            return super().__enter__()

    loop = asyncio.new_event_loop()
    old_d, new_d = Checked(60.0), Deadline(60.0)

    def run(d: Deadline) -> Timed:
        async def many(n: int) -> None:
            d._task = asyncio.current_task()  # each run is a new task: bind it (a connection's is one task)
            for _ in range(n):
                with d:
                    pass

        return lambda n: loop.run_until_complete(many(n))

    return run(old_d), run(new_d)


def piece_parts() -> tuple[Timed, Timed]:
    from gateway.protocol import quote
    from segmentation import StreamSegmenter

    seg = StreamSegmenter("en", "sentence")
    seg.feed("word " * 40)  # pending, no sentence end yet
    piece = " hello"
    loop = asyncio.new_event_loop()

    async def commit(segments: list[object]) -> None:
        unspoken: list[object] = []
        for _ in segments:
            pass
        if unspoken:
            raise AssertionError

    async def old_many(n: int) -> None:
        for _ in range(n):
            refused = f"{len(piece)} characters of input.text ({quote(piece, 40)}) were not accepted"
            pending = len(seg.pending)
            await commit([])
        del refused, pending

    async def new_many(n: int) -> None:
        for _ in range(n):
            def refused() -> str:
                return f"{len(piece)} characters of input.text ({quote(piece, 40)}) were not accepted"

            pending = seg.pending_chars
            segments: list[object] = []
            if segments:
                await commit(segments)
        del refused, pending

    return (lambda n: loop.run_until_complete(old_many(n))), (lambda n: loop.run_until_complete(new_many(n)))


def renewal_parts(work: Path, records: list[Timed]) -> tuple[Timed, Timed, Callable[[], None]]:
    """The `renewal` part's old and new, and a stop; the `record` part's appended to `records`."""
    from bench.capacity import Redis
    from sessions import SessionStore
    from sessions.store_settings import StoreSettings

    redis = Redis(work)
    loop = asyncio.new_event_loop()
    store = SessionStore.from_url(redis.url, settings=StoreSettings(lease_ttl_s=60.0))
    batch = 64

    async def setup() -> list[Any]:
        await store.start()
        leases = []
        for _ in range(batch):
            rec = await store.create_session("acme", {})
            leases.append(await store.acquire_lease("acme", rec.session_id))
        return leases

    leases = loop.run_until_complete(setup())

    async def one_by_one(n: int) -> None:
        for i in range(n):
            await store.renew_lease(leases[i % batch])

    async def batched(n: int) -> None:
        for _ in range(n // batch):
            await store._renew_batch(leases)

    async def record_one(n: int) -> None:
        for i in range(n):
            lease = leases[i % batch]
            await store.record_utterance("acme", lease.session_id, i, "Hello there.", at_ms=1)

    async def record_batched(n: int) -> None:
        for j in range(n // batch):
            calls = [store.record_utterance_call("acme", lease.session_id, j, "Hello there.", at_ms=1)
                     for lease in leases]  # fmt: skip
            await store._write_batch(calls)

    def stop() -> None:
        loop.run_until_complete(store.close())
        redis.stop()

    run: Callable[[Callable[[int], Awaitable[None]]], Timed] = lambda f: lambda n: loop.run_until_complete(f(n))  # noqa: E731
    records.extend((run(record_one), run(record_batched)))
    return run(one_by_one), run(batched), stop


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "capacity_parts_s24"))
    p.add_argument("--only", default="", help="comma-separated part names (default: all)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="capacity-parts-"))
    stop: Callable[[], None] = lambda: None  # noqa: E731
    parts: dict[str, tuple[Timed, Timed, int]] = {
        "bridge": (*bridge_parts(), 20_000),
        "poller": (*poller_parts(), 5_000),
        "drain": (*drain_parts(), 20_000),
        "send": (*send_parts(), 20_000),
        "counter": (*counter_parts(), 50_000),
        "tick": (*tick_parts(), 25_600),
        "idle": (*idle_parts(), 20_000),
        "deadline": (*deadline_parts(), 100_000),
        "piece": (*piece_parts(), 100_000),
        "admission": (*session.admission_parts(), 2_000),
        "chain": (*session.chain_parts(), 20_000),
        "wsread": (*ws.wsread_parts(), 20_000),
    }
    steps = {name: (step, 20_000) for name, step in session.piece_kinds().items()}
    only = set(filter(None, args.only.split(",")))
    try:
        if only and not only & {"renewal", "record"}:
            raise RuntimeError("not asked for")
        records: list[Timed] = []
        old, new, stop = renewal_parts(work, records)
        parts["renewal"] = (old, new, 640)
        parts["record"] = (records[0], records[1], 640)
    except Exception as e:  # no redis-server here: the other parts still stand
        print(f"renewal: not measured ({e})", file=sys.stderr)
    rows = {}
    for name, (old, new, n) in parts.items():
        if only and name not in only:
            continue
        old(n // 10), new(n // 10)  # warm
        olds, news = [], []
        for _ in range(args.rounds):
            olds.append(cpu_us(old, n))
            news.append(cpu_us(new, n))
        ratios = [b / a for a, b in zip(olds, news, strict=True)]
        rows[name] = {"old_us": round(statistics.median(olds), 3), "new_us": round(statistics.median(news), 3),
                      "saved_us": round(statistics.median(olds) - statistics.median(news), 3),
                      "new_over_old": round(statistics.median(ratios), 3), "n": n, "rounds": args.rounds}  # fmt: skip
        print(name, json.dumps(rows[name]), flush=True)
    for name, (step, n) in steps.items():  # alone: where a text piece's µs go
        if only and name not in only:
            continue
        step(n // 10)
        us = statistics.median(cpu_us(step, n) for _ in range(args.rounds))
        rows[name] = {"us": round(us, 3), "n": n, "rounds": args.rounds}
        print(name, json.dumps(rows[name]), flush=True)
    stop()
    load = os.getloadavg()[0]
    Path(args.out + ".json").write_text(json.dumps({"load": load, "parts": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
