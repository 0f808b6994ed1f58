"""Talkers side by side: the same Qwen3 engine (core, codec, scheduling) on each talker backend named
(`native`, `vllm`), one process, in turn at each concurrency and in alternating order so the box's
noise hits both alike: aggregate frames/s, TTFA p50/p95 and underruns (bench/engine_bench.py's
measures), per-stream prefills, and the vLLM talker's start-up time.

    python bench/talker_bench.py [--talker native,vllm] [--model tiny|PATH] [--concurrency 1,8,16,32]
        [--frames 100] [--json bench/out/engine_talkers.json]

The vLLM talker needs vLLM (run it with .venv-vllm/bin/python on CPU; docs/vllm.md). "tiny" means the
tiny checkpoint with a 32-wide talker head here, for both talkers: vLLM's CPU attention has no kernel
for the default tiny's 16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine import load_engine  # noqa: E402
from engine.cache import cache_dir  # noqa: E402
from engine.qwen3.serving.qwen3_engine import Qwen3Engine  # noqa: E402
from engine.qwen3.tiny import make_tiny_checkpoint  # noqa: E402

DEFAULT_LEVELS = "1,8,16,32"


def tiny32() -> Path:
    """The tiny checkpoint with talker head_dim 32, written once into the cache directory."""
    path = cache_dir(None) / "qwen3-tts-tiny-hd32-bench"
    if not (path / "config.json").exists():
        make_tiny_checkpoint(path, seed=0, talker_head_dim=32)
    return path


def talker_main(args: argparse.Namespace, levels: list[int], options: dict[str, Any]) -> int:
    from engine_bench import bench_text, engine_run

    talkers = [t.strip() for t in args.talker.split(",") if t.strip()]
    model = str(tiny32()) if args.model in ("tiny", "tiny32") else args.model
    engines: dict[str, Qwen3Engine] = {}
    start_s: dict[str, float] = {}
    try:
        for name in talkers:
            t0 = time.perf_counter()
            eng = load_engine(model, talker=name, **options)
            assert isinstance(eng, Qwen3Engine)
            engines[name], start_s[name] = eng, time.perf_counter() - t0
            print(f"talker {name}: loaded and warmed in {start_s[name]:.1f} s", flush=True)
        text = bench_text(next(iter(engines.values())).model, args.frames)
        rows: list[dict[str, Any]] = []
        for i, n in enumerate(levels):
            row: dict[str, Any] = {"n": n}
            order = talkers if i % 2 == 0 else list(reversed(talkers))
            for name in order:
                eng = engines[name]
                prefills = eng.core.stats.prefills
                row[name] = asyncio.run(engine_run(eng, n, text, seed0=1000 * i))
                row[name]["prefills_per_stream"] = (eng.core.stats.prefills - prefills) / n
            rows.append(row)
            print(f"  N={n}: " + ", ".join(f"{t} {row[t]['frames_per_s']:.1f} f/s" for t in talkers), flush=True)
    finally:
        for eng in engines.values():
            eng.close()
    print()
    head = f"{'N':>3} | " + " | ".join(f"{t + ' f/s':>11} {'TTFA p50':>8} {'p95':>6} {'undr':>4}" for t in talkers)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['n']:>3} | " + " | ".join(
            f"{r[t]['frames_per_s']:>11.1f} {r[t]['ttfa_p50_s'] or 0:>8.3f} {r[t]['ttfa_p95_s'] or 0:>6.3f} "
            f"{r[t]['underruns']:>4}" for t in talkers))
    out = {"model": model, "talkers": talkers, "frames_per_stream": args.frames, "start_s": start_s,
           "cpu_count": os.cpu_count(), "load_average": os.getloadavg()[0], "options": options, "rows": rows}
    path = args.json
    if path.name == "engine.json":  # engine_bench's default: not this table's
        path = path.with_name("engine_talkers.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=float))
    print(f"\nwrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--talker", default="native,vllm")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", default=DEFAULT_LEVELS)
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "engine_talkers.json")
    ap.add_argument("--smoke", action="store_true", help="concurrency 1,2 and 8 frames: checks the harness runs")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="the native talker's CUDA graphs (engine/qwen3/serving/graphs.py)")
    args, _ = ap.parse_known_args(argv)  # also called by engine_bench.py --talker: its other options pass
    levels = [1, 2] if args.smoke else [int(x) for x in args.concurrency.split(",")]
    if args.smoke:
        args.frames = 8
    options = dict(max_streams=max(levels), threads=args.threads, max_frames=args.frames, device=args.device,
                   cuda_graphs=args.cuda_graphs, max_context=max(256, 64 * math.ceil((args.frames + 160) / 64)))
    return talker_main(args, levels, options)


if __name__ == "__main__":
    raise SystemExit(main())
