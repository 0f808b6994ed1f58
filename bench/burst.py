"""A reconnect storm: N WebSocket sessions connecting at once to a real gateway (a deploy, a balancer's
failover). Each sends `session.config` and waits for `session.ready` (optionally then one tiny utterance).

    python bench/burst.py [-n 96,128,256,512] [--store redis|embedded|both] [--utterance] [--smoke]
                          [--pool CONNECTIONS] [--pool-wait S] [--json bench/results/burst.json]

The gateway runs as its own process (`voxgate serve --model piper --in-process`, on a free port) with a
real redis-server (started here, on a free port) or the embedded store. Starting a session costs the
engine nothing (a config check), so what is measured is the session start path: the store, its pool and
its breaker. Goal: no session refused for state; past the gateway's limits, refusals carry a capacity
code (`queue_full`), never `state_unavailable`.

Printed per (store, N): sessions ready, refused by code, connect→ready p50/p99, the worst /health
latency meanwhile. `--smoke` is the CI form (N = 16, 48).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from canary import HealthProbe, ws_url
from processes import stop

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"type": "session.config", "voice": "joe", "language": "en"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        time.sleep(0.1)
    sys.exit(f"nothing listens on {port} after {seconds:.0f} s")


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                 "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            _wait_port(port, proc, 10)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop(proc, grace_s=10)


@contextlib.contextmanager
def gateway(redis_url: str | None, model: str, extra_env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", model, "--in-process", "--port", str(port)]
    if redis_url:
        cmd += ["--redis-url", redis_url]
    env = os.environ | {"PYTHONPATH": str(ROOT)} | extra_env
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc, 120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # listening is not ready: wait for the model to warm
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health", None, 5) as r:
                if json.load(r).get("status") == "ok":
                    break
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc, grace_s=15)


async def one_session(url: str, start: asyncio.Event, utterance: bool, timeout: float) -> tuple[str, float]:
    """('ready' | an error code | 'close:<code>' | 'connect_failed', seconds from connect to the answer)."""
    await start.wait()
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with websockets.connect(ws_url(url), max_size=None, open_timeout=timeout) as ws:
                await ws.send(json.dumps(CONFIG))
                ev = json.loads(await ws.recv())
                took = time.monotonic() - t0
                if ev["type"] != "session.ready":
                    return (ev.get("code", ev["type"]) if ev["type"] == "error" else ev["type"]), took
                if utterance:
                    await ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
                    await ws.send(json.dumps({"type": "input.done"}))
                    while not (isinstance(m := await ws.recv(), str) and json.loads(m)["type"] == "session.done"):
                        pass
                return "ready", took
    except websockets.ConnectionClosed as e:
        return f"close:{e.rcvd.code if e.rcvd else '?'}", time.monotonic() - t0
    except (OSError, TimeoutError, websockets.InvalidStatus, websockets.InvalidHandshake) as e:
        return f"connect_failed:{type(e).__name__}", time.monotonic() - t0


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


async def burst(url: str, n: int, *, utterance: bool, timeout: float) -> dict[str, Any]:
    start = asyncio.Event()
    async with HealthProbe(url) as health:
        tasks = [asyncio.create_task(one_session(url, start, utterance, timeout)) for _ in range(n)]
        await asyncio.sleep(0.2)  # every task waits on the start line
        t0 = time.monotonic()
        start.set()
        results = await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
        await asyncio.sleep(0.3)
    outcomes = Counter(code for code, _ in results)
    ready = [s for code, s in results if code == "ready"]
    return {
        "n": n, "ready": outcomes.pop("ready", 0), "refused": dict(outcomes),
        "connect_p50_ms": round(pct(ready, 0.5) * 1000, 1), "connect_p99_ms": round(pct(ready, 0.99) * 1000, 1),
        "wall_s": round(wall, 2), "health_worst_s": health.worst_s, "health_statuses": dict(health.statuses),
        "mean_ms": round(statistics.fmean(ready) * 1000, 1) if ready else None,
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'store':9} {'N':>4} {'ready':>5}  {'refused (by code)':34} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'/health worst s':>15}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r["refused"].items())) or "-"
        lines.append(f"{r['store']:9} {r['n']:>4} {r['ready']:>5}  {refused:34} {r['connect_p50_ms']:>8} "
                     f"{r['connect_p99_ms']:>8} {r['health_worst_s']:>15}")  # fmt: skip
    return "\n".join(lines)


async def run_store(store: str, sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(redis_server()) if store == "redis" else None
        env = {}
        if args.pool is not None:  # the store's connections (gateway setting redis_max_connections)
            env["VOXGATE_REDIS_MAX_CONNECTIONS"] = str(args.pool)
        if args.pool_wait is not None:
            env["VOXGATE_REDIS_POOL_WAIT_S"] = str(args.pool_wait)
        url = stack.enter_context(gateway(redis_url, args.model, env))
        for n in sizes:
            r = await burst(url, n, utterance=args.utterance, timeout=args.timeout)
            rows.append({"store": store} | r)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            await asyncio.sleep(1.0)  # the sessions of one burst close before the next
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", default="96,128,256,512", help="comma-separated burst sizes")
    p.add_argument("--store", choices=["redis", "embedded", "both"], default="both")
    p.add_argument("--model", default="piper", help="the served model (starting a session costs it nothing)")
    p.add_argument("--utterance", action="store_true", help="each session also speaks one tiny utterance")
    p.add_argument("--timeout", type=float, default=60.0, help="per session, seconds")
    p.add_argument("--pool", type=int, default=None, help="the store's connections (default: the gateway's, 256)")
    p.add_argument("--pool-wait", type=float, default=None, help="seconds a call waits for one (default 5)")
    p.add_argument("--smoke", action="store_true", help="CI: N = 16,48")
    p.add_argument("--json", default=str(ROOT / "bench/results/burst.json"))
    args = p.parse_args(argv)
    sizes = [16, 48] if args.smoke else [int(x) for x in args.n.split(",")]
    stores = ["redis", "embedded"] if args.store == "both" else [args.store]
    print(table([]))
    rows = [r for s in stores for r in asyncio.run(run_store(s, sizes, args))]
    print()
    print(table(rows))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(sys.argv), "utterance": args.utterance, "pool": args.pool, "pool_wait": args.pool_wait}
    out.write_text(json.dumps(meta | {"rows": rows}, indent=1))
    print(f"wrote {out}")
    bad = sum(r["refused"].get("state_unavailable", 0) for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
