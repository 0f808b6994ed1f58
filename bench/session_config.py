"""What one `session.config` costs: the round trip from a config to its `session.ready`, and the
engine's share of it (the check that replaced the probe stream opened and cancelled at every config).

    .venv/bin/python bench/session_config.py --model piper --configs 300

A real gateway on loopback (embedded store), one WebSocket sending `--configs` configs one after another
(alternating two voices' languages so nothing is cached); then the engine alone: `check(request)` beside
the probe it replaced (`open_stream(...).cancel()`). Prints a table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import uvicorn
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.servers import free_port

from engine import Engine, load_engine
from gateway.app import create_app
from gateway.server import server_config
from gateway.settings import Settings


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    return {"n": len(ms), "mean_ms": round(statistics.fmean(ms), 4), "p50_ms": round(ms[len(ms) // 2], 4),
            "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 4)}  # fmt: skip


async def configs(url: str, n: int) -> list[float]:
    out = []
    async with websockets.connect(f"ws://{url}/v1/audio/speech/stream") as ws:
        for i in range(n):
            t = time.perf_counter()
            await ws.send(json.dumps({"type": "session.config", "language": ("en", "auto")[i % 2], "speed": 1.0}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "session.ready", reply
            out.append(time.perf_counter() - t)
    return out[5:]  # the first few warm the route


def engine_alone(engine: Engine, n: int) -> dict[str, dict[str, float]]:
    probe: list[float] = []
    check: list[float] = []
    for i in range(n):
        language = ("en", "auto")[i % 2]
        t = time.perf_counter()
        engine.open_stream(None, language, sample_rate=16000).cancel()
        probe.append(time.perf_counter() - t)
        if hasattr(engine, "check"):  # absent before the check replaced the probe (the "before" run)
            from engine.options import stream_request

            t = time.perf_counter()
            engine.check(stream_request(None, language, {"sample_rate": 16000}))
            check.append(time.perf_counter() - t)
    return {"probe_stream": summary(probe), **({"check": summary(check)} if check else {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="piper")
    ap.add_argument("--configs", type=int, default=300)
    ap.add_argument("--out", default="bench/out/session_config.json")
    args = ap.parse_args()
    engine = load_engine(args.model)
    port = free_port()
    settings = Settings(model=args.model, port=port)
    server = uvicorn.Server(server_config(create_app(settings, engine=engine), settings, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    result = {"model": args.model, "session_config": summary(asyncio.run(configs(f"127.0.0.1:{port}", args.configs))),
              **engine_alone(engine, args.configs)}  # fmt: skip
    server.should_exit = True
    thread.join(10)
    engine.close()
    print(f"{'what':<16}{'n':>6}{'mean ms':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name, row in result.items():
        if isinstance(row, dict):
            print(f"{name:<16}{row['n']:>6}{row['mean_ms']:>10.3f}{row['p50_ms']:>10.3f}{row['p99_ms']:>10.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
