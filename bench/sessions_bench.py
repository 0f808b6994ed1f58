"""Session-store latency: what Redis adds to session start, resume and cross-replica cancel, against the
embedded (fakeredis) store, side by side. Store level (no WebSocket): the gateway adds its own framing.

- start  = create_session + acquire_lease + subscribe (what a new WS session does before session.ready)
- resume = resume_session + acquire_lease (taking over) + subscribe, on another replica
- cancel = publish_cancel on replica B → message out of replica A's subscription
- plus single operations (ping, load_session, record_utterance, stream slot acquire+release).

    python bench/sessions_bench.py [--redis-url URL] [-n 500] [--json bench/out/sessions.json]

Without --redis-url a redis-server (on PATH) is started on a free port for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sessions import SessionStore


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def timed(n: int, body: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await body()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def run_backend(url: str | None, n: int) -> dict[str, list[float]]:
    a = SessionStore.from_url(url, replica_id="A")
    b = SessionStore.from_url(url, replica_id="B")
    await a.start()
    await b.start()
    res: dict[str, list[float]] = {}
    try:
        res["ping"] = await timed(n, a.client.ping)
        rec = await a.create_session("bench", {"language": "en"})
        sid = rec.session_id
        res["load_session"] = await timed(n, lambda: a.load_session("bench", sid))
        counter = iter(range(10**9))
        res["record_utterance"] = await timed(n, lambda: a.record_utterance("bench", sid, next(counter), "x" * 80))

        async def slot() -> None:
            s = await a.acquire_stream("bench", 100)
            await s.release()

        res["stream_acquire+release"] = await timed(n, slot)

        started: list[tuple[str, Any, Any]] = []

        async def start() -> None:
            r = await a.create_session("bench", {"language": "en", "voice": "anna"})
            lease = await a.acquire_lease("bench", r.session_id)
            sub = await a.subscribe("bench", r.session_id, lease=lease)
            started.append((r.session_id, lease, sub))

        res["session_start"] = await timed(n, start)

        resumed = iter(started)
        new_subs = []

        async def resume() -> None:
            sid, _lease, _sub = next(resumed)
            await b.resume_session("bench", sid)
            lease = await b.acquire_lease("bench", sid)  # takes over from A
            new_subs.append(await b.subscribe("bench", sid, lease=lease))

        res["session_resume"] = await timed(n, resume)

        sid2 = (await a.create_session("bench", {})).session_id
        sub = await a.subscribe("bench", sid2)

        async def cancel() -> None:
            await b.publish_cancel("bench", sid2)
            msg = await sub.get(timeout=5)
            assert msg is not None and msg.kind == "cancel"

        res["cross_replica_cancel"] = await timed(n, cancel)
    finally:
        await a.client.flushall()
        await a.close()
        await b.close()
    return res


def start_redis(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH (apt-get install -y redis-server) or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.02)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url")
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.redis_url
        if url is None:
            proc, url = start_redis(tmp)
        try:
            results = {"redis": asyncio.run(run_backend(url, args.n)),
                       "embedded": asyncio.run(run_backend(None, args.n))}
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    table: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'operation (ms)':<24}{'redis p50':>11}{'redis p99':>11}{'embed p50':>11}{'embed p99':>11}")
    for op in results["redis"]:
        row = {b: {"p50": pct(results[b][op], 0.5), "p99": pct(results[b][op], 0.99),
                   "mean": statistics.fmean(results[b][op])} for b in results}
        table[op] = row
        print(f"{op:<24}{row['redis']['p50']:>11.3f}{row['redis']['p99']:>11.3f}"
              f"{row['embedded']['p50']:>11.3f}{row['embedded']['p99']:>11.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"n": args.n, "results_ms": table}, indent=2))


if __name__ == "__main__":
    main()
