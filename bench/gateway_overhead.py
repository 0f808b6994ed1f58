"""What the gateway adds to time-to-first-audio, side by side with the engine alone.

For N concurrent sessions (default 1 and 64), each sends one short reply; we time, over a real
WebSocket on loopback, `input.done` → first binary frame (`done`, split_granularity none), and the
token after the first sentence's full stop → first binary frame (`sentence`, auto mode). In the same
run, the same texts go straight to the engine (`open_stream` + `append` + `finish` → first `AudioChunk`) at the same
concurrency. The difference of the two is the gateway's share: segmentation, normalisation, the
store, the outbox and the socket. Prints a table, writes JSON.

The WebSocket clients run in a child process by default (`--clients process`), as real agents do: in
the server's process their socket work would take turns on the server's GIL with the gateway and the
engine thread and count as overhead. `--clients inline` keeps them in-process (an upper bound).

`--engines inproc,process` (the default: both, side by side in one run) serves the gateway first with
the engine in its own process (`load_engine`), then with the engine in a child process
(`engine.process.start_engine`, the server's default); the engine-alone times are always the in-process
engine's, so `overhead` is everything the serving path adds, the process hop included. Each server
serves one untimed session first (a child's first stream is cold). The served engine says it cannot
judge its capacity (`capacity()` None), so admission lets all N in at once as the engine-alone path
does: on a loaded box its measured capacity would queue most of 64 sessions, and the bench would time
admission's queue (a policy) instead of the serving path.

    python bench/gateway_overhead.py [--model tiny] [--sessions 1,64] [--rounds 3] [--clients process|inline]
        [--engines inproc,process] [--triggers done,sentence] [--engine-option KEY=VALUE ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import websockets  # noqa: E402
from support.servers import serve  # noqa: E402

from engine import AudioChunk, Engine, load_engine  # noqa: E402

TEXTS = [f"Sure, here is answer number {i}. It is short." for i in range(256)]
TIMEOUT_S = 120.0  # a session's wait for its audio: a hang fails the round, it does not stall the bench
# Every session waits its turn (as the engine-alone path does), none is refused for waiting.
QUEUEING = {"max_waiting_per_tenant": 256, "max_queue_wait_s": 600.0}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def via_gateway(addr: str, n: int, trigger: str) -> list[float]:
    """`done`: the whole text, then time from `input.done`. `sentence`: word tokens in `auto` mode,
    timed from the token after the first sentence's full stop (the one that lets it commit)."""

    async def one(i: int) -> float:
        async with websockets.connect(f"ws://{addr}/v1/audio/speech/stream", max_size=None) as ws:
            mode = "none" if trigger == "done" else "auto"
            await ws.send(json.dumps({"type": "session.config", "language": "en", "split_granularity": mode}))
            await ws.recv()
            first, rest = TEXTS[i].split(". ", 1)
            if trigger == "done":
                await ws.send(json.dumps({"type": "input.text", "text": TEXTS[i]}))
            else:
                for word in (first + ".").split(" "):
                    await ws.send(json.dumps({"type": "input.text", "text": word + " "}))
            await asyncio.sleep(0.5)  # every session settled: time the steady state, not 64 sessions opening
            t0 = time.perf_counter()
            if trigger == "sentence":
                await ws.send(json.dumps({"type": "input.text", "text": rest}))
            await ws.send(json.dumps({"type": "input.done"}))
            while isinstance(m := await asyncio.wait_for(ws.recv(), TIMEOUT_S), str):
                if json.loads(m)["type"] == "error":  # refused (or failed): not a time to first audio
                    raise RuntimeError(m[:200])
            t = time.perf_counter() - t0
            while True:  # let the utterance finish so the next round starts from idle
                m = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
                if isinstance(m, str) and json.loads(m)["type"] == "session.done":
                    return t

    out = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    if failed := [e for e in out if isinstance(e, BaseException)]:
        print(f"  {len(failed)} of {n} sessions gave no audio: {failed[0]!r}", file=sys.stderr)
    return [t for t in out if isinstance(t, float)]


async def via_engine(engine: Engine, n: int, trigger: str) -> list[float]:
    """The engine alone, from the text the gateway would have committed at that moment."""

    async def one(i: int) -> float:
        stream = engine.open_stream(None, "en")
        t0 = time.perf_counter()
        if trigger == "done":
            stream.append(TEXTS[i] + " ")
        else:
            first, rest = TEXTS[i].split(". ", 1)
            stream.append(first + ". ")
            stream.append(rest + " ")
        stream.finish()
        t = None
        async for ev in stream.events():
            if t is None and isinstance(ev, AudioChunk):
                t = time.perf_counter() - t0
        assert t is not None
        return t

    return list(await asyncio.gather(*(one(i) for i in range(n))))


class Uncapped:
    """The engine, saying it cannot judge its capacity (the module docstring says why)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def capacity(self) -> None:
        return None


def gateway_round(addr: str, n: int, trigger: str, clients: str) -> list[float]:
    if clients == "inline":
        return asyncio.run(via_gateway(addr, n, trigger))
    out = subprocess.run([sys.executable, __file__, "--client", addr, str(n), trigger],
                         check=True, capture_output=True, text=True).stdout
    return [float(x) for x in json.loads(out)]


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--client":  # the child process of `--clients process`
        _, _, addr, n, trigger = sys.argv
        print(json.dumps(asyncio.run(via_gateway(addr, int(n), trigger))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--sessions", default="1,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", choices=("process", "inline"), default="process")
    ap.add_argument("--engines", default="inproc,process", help="where the served engine runs, in turn")
    ap.add_argument("--triggers", default="done,sentence")
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a load_engine option for both engines, e.g. max_streams=64 (JSON value when it parses)")
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "gateway_overhead.json"))
    args = ap.parse_args()
    options: dict[str, Any] = {}
    for item in args.engine_option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    engine = load_engine(args.model, **options)
    results: dict[str, Any] = {"model": args.model, "engine_options": options, "clients": args.clients,
                               "load_average": os.getloadavg()[0], "rows": []}
    print(f"{'engine':8} {'from':9} {'sessions':>8} {'path':8} {'p50 ms':>8} {'p99 ms':>8}")
    for where in args.engines.split(","):
        served: Any = engine
        if where == "process":
            from engine.process import start_engine

            served = start_engine(args.model, **options)
            served.wait_ready(600)
        server = serve(Uncapped(served), **QUEUEING)  # type: ignore[arg-type]
        addr = next(server)
        gateway_round(addr, 1, "done", args.clients)  # untimed: the first stream of a child is cold
        for trigger in args.triggers.split(","):
            for n in (int(x) for x in args.sessions.split(",")):
                gw: list[float] = []
                en: list[float] = []
                for _ in range(args.rounds):  # interleaved, so machine noise hits both paths alike
                    gw += gateway_round(addr, n, trigger, args.clients)
                    en += asyncio.run(via_engine(engine, n, trigger))
                row: dict[str, Any] = {"engine": where, "from": trigger, "sessions": n, "samples": len(gw)}
                for name, xs in (("gateway", gw), ("engine", en)):
                    row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = pct(xs, 50) * 1e3, pct(xs, 99) * 1e3
                row["overhead_p50_ms"] = row["gateway_p50_ms"] - row["engine_p50_ms"]
                row["overhead_p99_ms"] = row["gateway_p99_ms"] - row["engine_p99_ms"]
                for name in ("gateway", "engine", "overhead"):
                    print(f"{where:8} {trigger:9} {n:8d} {name:8} {row[f'{name}_p50_ms']:8.1f} "
                          f"{row[f'{name}_p99_ms']:8.1f}", flush=True)
                results["rows"].append(row)
        next(server, None)
        if served is not engine:
            served.close()
    engine.close()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
