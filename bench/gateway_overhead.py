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

    python bench/gateway_overhead.py [--model tiny] [--sessions 1,64] [--rounds 3] [--clients process|inline]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
            while not isinstance(await ws.recv(), bytes):
                pass
            t = time.perf_counter() - t0
            while True:  # let the utterance finish so the next round starts from idle
                m = await ws.recv()
                if isinstance(m, str) and json.loads(m)["type"] == "session.done":
                    return t

    return list(await asyncio.gather(*(one(i) for i in range(n))))


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
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "gateway_overhead.json"))
    args = ap.parse_args()
    engine = load_engine(args.model)
    server = serve(engine)
    addr = next(server)
    results: dict[str, Any] = {"model": args.model, "clients": args.clients, "rows": []}
    print(f"{'from':9} {'sessions':>8} {'path':8} {'p50 ms':>8} {'p99 ms':>8}")
    for trigger in ("done", "sentence"):
        for n in (int(x) for x in args.sessions.split(",")):
            gw: list[float] = []
            en: list[float] = []
            for _ in range(args.rounds):  # interleaved, so machine noise hits both paths alike
                gw += gateway_round(addr, n, trigger, args.clients)
                en += asyncio.run(via_engine(engine, n, trigger))
            row: dict[str, Any] = {"from": trigger, "sessions": n, "samples": len(gw)}
            for name, xs in (("gateway", gw), ("engine", en)):
                row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = pct(xs, 50) * 1e3, pct(xs, 99) * 1e3
            row["overhead_p50_ms"] = row["gateway_p50_ms"] - row["engine_p50_ms"]
            row["overhead_p99_ms"] = row["gateway_p99_ms"] - row["engine_p99_ms"]
            for name in ("gateway", "engine", "overhead"):
                print(f"{trigger:9} {n:8d} {name:8} {row[f'{name}_p50_ms']:8.1f} {row[f'{name}_p99_ms']:8.1f}")
            results["rows"].append(row)
    next(server, None)
    engine.close()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
