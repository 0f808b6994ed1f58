"""Qwen3 engine benchmark: continuous batching vs. a naive one-stream-at-a-time baseline, same process.

For each concurrency N (default 1, 2, 4, 8, 16, 32), N streams open at once, each appends its text and
finishes; every stream makes `--frames` frames (the tiny model almost never says EOS, so the frame cap
sets the length; a real checkpoint may stop earlier). Measured through the real Stream/EventBridge path:

- aggregate frames/s (all frames ÷ wall time to the last StreamEnd) and per-stream real-time factor
  (open → end wall time ÷ audio seconds; < 1 is faster than real time);
- time to first audio (open → first AudioChunk) p50/p95;
- underruns: a player that starts at a stream's first chunk and pauses when dry (bench/audio_metrics.py);
- cancel latency: N streams with audio, each cancelled in turn; cancel() → StreamEnd at the consumer,
  and cancel() → slot freed inside the core, against the engine's cycle time.

The baseline (the faster-qwen3-tts shape) serves the same N requests one at a time: a batch-1 talker
loop (the same model primitives, so only batching and decoding differ), and every
`BASELINE_CHUNK` frames a full re-decode of the chunk with `BASELINE_LEFT` frames of
left context (approximate, no carried state), keeping only the new samples.

    python bench/engine_bench.py [--model tiny|PATH] [--concurrency 1,2,4,8,16,32] [--frames 100]
        [--threads 1] [--json bench/out/engine.json] [--png bench/out/engine.png] [--smoke]

`--process` compares instead the same engine in-process and in a child process (engine/process,
the server's default) at each concurrency (default 1, 16, 32), `--repeats` times each in rotated order
so the box's noise hits every side alike: frames/s, CPU ms per frame (this process and every engine
child, idle ones too), TTFA and the ratios (process ÷ in-process); `--relay-compare` adds a child whose
relay sends one awaited zmq message per event (the relay before it batched, engine/process/server.py
PER_EVENT), so before and after are measured in one run. JSON to bench/out/engine_process.json unless
`--json` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from audio_metrics import pausing_player, percentile  # noqa: E402

from engine import AudioChunk, StreamEnd, load_engine  # noqa: E402
from engine.qwen3 import generate  # noqa: E402
from engine.qwen3.generate import SamplingParams  # noqa: E402
from engine.qwen3.model import Qwen3TTSModel  # noqa: E402
from engine.qwen3.serving.qwen3_engine import Qwen3Engine  # noqa: E402

RATE = 24000
FRAME = 1920
BASELINE_CHUNK = 12  # frames per baseline decode (faster-qwen3-tts streams 12-frame chunks)
BASELINE_LEFT = 25  # frames of left context re-decoded with each chunk
CONCURRENCY = "1,2,4,8,16,32"
DEFAULT_JSON = REPO / "bench" / "out" / "engine.json"
TEXT = "Thanks for waiting. I checked your account, and the refund went out this morning. "


def bench_text(model: Qwen3TTSModel, frames: int) -> str:
    """TEXT repeated to at least `frames` tokens: a model reads one text token per frame and may say EOS
    once the text is read, so the frame cap, not the text, sets every stream's length."""
    text = TEXT
    while len(model.tokenizer.encode(text)) < frames:
        text += TEXT
    return text


# ---- the engine ----------------------------------------------------------------------------------
async def _consume(stream: Any, t_open: float) -> dict[str, Any]:
    arrivals: list[float] = []
    sizes: list[int] = []
    end: StreamEnd | None = None
    async for ev in stream.events():
        if isinstance(ev, AudioChunk):
            arrivals.append(time.perf_counter() - t_open)
            sizes.append(ev.pcm.size)
        else:
            end = ev
    return {"arrivals": arrivals, "sizes": sizes, "end": end, "t_end": time.perf_counter() - t_open}


async def engine_run(eng: Qwen3Engine, n: int, text: str, seed0: int) -> dict[str, Any]:
    cpu0 = eng.core.stats.cpu_s
    t0 = time.perf_counter()
    streams = []
    for i in range(n):
        s = eng.open_stream(None, "en", seed=seed0 + i)
        s.append(text)
        s.finish()
        streams.append(s)
    results = await asyncio.gather(*[_consume(s, t0) for s in streams])
    wall = time.perf_counter() - t0
    return summarize_run(results, wall, eng.core.stats.cpu_s - cpu0)


async def engine_cancels(eng: Qwen3Engine, n: int, text: str, seed0: int) -> dict[str, Any]:
    """N streams with audio flowing, cancelled one by one: consumer-side and core-side latency."""
    streams = []
    for i in range(n):
        s = eng.open_stream(None, "en", seed=seed0 + i)
        s.append(text * 4)  # long enough to still be talking when cancelled
        s.finish()
        streams.append(s)
    first = [asyncio.Event() for _ in streams]
    ends: list[float] = [0.0] * n
    cancelled_at: list[float] = [0.0] * n

    async def consume(i: int) -> None:
        async for ev in streams[i].events():
            if isinstance(ev, AudioChunk):
                first[i].set()
            elif isinstance(ev, StreamEnd):
                ends[i] = time.perf_counter()

    tasks = [asyncio.create_task(consume(i)) for i in range(n)]
    await asyncio.gather(*[e.wait() for e in first])
    core_before = len(eng.core.stats.cancel_latency_s)
    cycles = list(eng.core.stats.cycle_s)[-200:]
    for i, s in enumerate(streams):
        cancelled_at[i] = time.perf_counter()
        s.cancel()
        await asyncio.sleep(0.02)
    await asyncio.gather(*tasks)
    # The consumer hears of a cancel at once; the core frees the slot at its next cycle: wait for it.
    deadline = time.perf_counter() + 5.0
    while len(eng.core.stats.cancel_latency_s) - core_before < n and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    consumer = [e - c for e, c in zip(ends, cancelled_at, strict=True)]
    core = list(eng.core.stats.cancel_latency_s)[core_before:]
    return {
        "consumer_p50_ms": 1e3 * statistics.median(consumer),
        "core_p50_ms": 1e3 * statistics.median(core) if core else None,
        "core_max_ms": 1e3 * max(core) if core else None,
        "cycle_p50_ms": 1e3 * statistics.median(cycles) if cycles else None,
        "cycle_max_ms": 1e3 * max(cycles) if cycles else None,
    }


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far (/proc/PID/stat)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def contract_run(eng: Any, n: int, text: str, seed0: int, pids: list[int] | None = None) -> dict[str, Any]:
    """`engine_run` through the contract alone (any Engine: in-process or in a child process); `pids`: the
    processes whose CPU time counts (this one and every engine child: an idle one's heartbeat too)."""
    cpu0 = _cpu_s(pids) if pids else 0.0
    t0 = time.perf_counter()
    streams = []
    for i in range(n):
        s = eng.open_stream(None, "en", seed=seed0 + i)
        s.append(text)
        s.finish()
        streams.append(s)
    results = await asyncio.gather(*[_consume(s, t0) for s in streams])
    return summarize_run(results, time.perf_counter() - t0, _cpu_s(pids) - cpu0 if pids else 0.0)


async def contract_cancels(eng: Any, n: int, text: str, seed0: int) -> dict[str, Any]:
    """N streams with audio flowing, all cancelled: cancel() → StreamEnd at the consumer, and cancel() →
    the engine counts none active (`capacity()`: live in-process; a child's next heartbeat, every 0.1 s,
    so an upper bound there)."""
    streams = []
    for i in range(n):
        s = eng.open_stream(None, "en", seed=seed0 + i)
        s.append(text * 4)
        s.finish()
        streams.append(s)
    iters = [s.events() for s in streams]
    for it in iters:
        while not isinstance(await anext(it), AudioChunk):
            pass
    t0 = time.perf_counter()
    for s in streams:
        s.cancel()
    for it in iters:
        async for _ in it:
            pass
    consumer = time.perf_counter() - t0
    while (c := eng.capacity()) is not None and c.active > 0 and time.perf_counter() - t0 < 10:
        await asyncio.sleep(0.002)
    return {"consumer_ms": 1e3 * consumer, "freed_ms": 1e3 * (time.perf_counter() - t0)}


def process_main(args: argparse.Namespace, levels: list[int], options: dict[str, Any]) -> int:
    """In-process vs child process, side by side (module docstring); with `--relay-compare` a third side,
    a child whose relay sends one awaited zmq message per event (the relay before batching)."""
    from engine.process import start_engine

    t = time.perf_counter()
    children: dict[str, Any] = {}
    if args.relay_compare:
        os.environ["VOXGATE_ENGINE_RELAY"] = "per_event"  # read by the child at start (spawn copies the env)
        try:
            children["per_event"] = start_engine(args.model, **options)
        finally:
            del os.environ["VOXGATE_ENGINE_RELAY"]
    children["process"] = start_engine(args.model, **options)  # warms while the in-process twin loads
    inproc = load_engine(args.model, **options)
    assert isinstance(inproc, Qwen3Engine)
    for child in children.values():
        child.wait_ready(900)
    print(f"model {args.model}: all warm in {time.perf_counter() - t:.1f} s; load average {os.getloadavg()[0]:.1f}")
    engines = {"inproc": inproc, **children}
    pids = [os.getpid(), *(c.pid for c in children.values())]
    text = bench_text(inproc.model, args.frames)
    rows: list[dict[str, Any]] = []
    try:
        for i, n in enumerate(levels):
            row: dict[str, Any] = {"n": n}
            sides = list(engines)
            for r in range(args.repeats):  # rotated, so the box's drift hits every side alike
                k = (i * args.repeats + r) % len(sides)
                for side in sides[k:] + sides[:k]:
                    run = asyncio.run(contract_run(engines[side], n, text, 1000 * i + 100 * r, pids))
                    row.setdefault(side + "_runs", []).append(run)
            for side in sides:
                runs = row.pop(side + "_runs")
                row[side] = _merged(runs)
                row[side]["cancel"] = asyncio.run(contract_cancels(engines[side], n, text, 1000 * i + 500))
            for side in children:
                row[f"{side}_ratio"] = row[side]["frames_per_s"] / row["inproc"]["frames_per_s"]
                row[f"{side}_cpu_ratio"] = row[side]["cpu_ms_per_frame"] / row["inproc"]["cpu_ms_per_frame"]
            row["frames_per_s_ratio"] = row["process_ratio"]
            rows.append(row)
            print(f"  N={n}: " + ", ".join(f"{side} {row[side]['frames_per_s']:.1f} f/s "
                                           f"{row[side]['cpu_ms_per_frame']:.2f} cpu ms/frame" for side in sides),
                  flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    print_process_table(rows, list(children))
    path = args.json if args.json != DEFAULT_JSON else REPO / "bench" / "out" / "engine_process.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": args.model, "frames_per_stream": args.frames, "options": options,
                                "repeats": args.repeats, "cpu_count": os.cpu_count(),
                                "load_average": os.getloadavg()[0], "rows": rows}, indent=2, default=str))
    print(f"\nwrote {path}")
    return 0


def _merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats of one side at one level: frames/s over their summed wall time; CPU ms per frame (every process
    counted: this one and each engine child); TTFA p50 the median of the runs'."""
    frames, wall, cpu = (sum(r[k] for r in runs) for k in ("frames", "wall_s", "cpu_s"))
    return {"frames": frames, "wall_s": wall, "frames_per_s": frames / wall, "cpu_ms_per_frame": 1e3 * cpu / frames,
            "ttfa_p50_s": statistics.median(ttfa) if (ttfa := [r["ttfa_p50_s"] for r in runs
                                                                if r["ttfa_p50_s"] is not None]) else None,
            "runs_frames_per_s": [r["frames_per_s"] for r in runs],
            "load_average": [r["load_average"] for r in runs]}  # fmt: skip


def print_process_table(rows: list[dict[str, Any]], children: list[str]) -> None:
    head = f"{'N':>3} | {'in-proc f/s':>11} {'cpu ms/f':>8} {'TTFA p50':>8} {'freed ms':>8}"
    for side in children:
        head += f" | {side + ' f/s':>15} {'cpu ms/f':>8} {'TTFA p50':>8} {'freed ms':>8} {'ratio':>5} {'cpu':>5}"
    print(f"\n{head}\n{'-' * len(head)}")
    for r in rows:
        a = r["inproc"]
        line = (f"{r['n']:>3} | {a['frames_per_s']:>11.1f} {a['cpu_ms_per_frame']:>8.2f} "
                f"{_fmt(a['ttfa_p50_s'], '.3f'):>8} {a['cancel']['freed_ms']:>8.1f}")
        for side in children:
            b = r[side]
            line += (f" | {b['frames_per_s']:>15.1f} {b['cpu_ms_per_frame']:>8.2f} {_fmt(b['ttfa_p50_s'], '.3f'):>8} "
                     f"{b['cancel']['freed_ms']:>8.1f} {r[side + '_ratio']:>5.3f} {r[side + '_cpu_ratio']:>5.3f}")
        print(line)


# ---- the baseline --------------------------------------------------------------------------------
@torch.no_grad()
def baseline_one(model: Qwen3TTSModel, text: str, seed: int, frames: int, emit: Any) -> int:
    """One request, batch 1, frame by frame; left-context re-decode every BASELINE_CHUNK frames."""
    prompt = model.build_prompt(text.rstrip(), voice=None, language="english")
    params = SamplingParams.from_defaults(model.gen, seed=seed)
    dev = model.device
    t = prompt.rows.shape[0]
    cache = model.new_kv_cache(1, t + frames + 1)
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    logits, hidden = model.talker.prefill(prompt.rows[None], torch.tensor([t], device=dev), slot, cache)
    seen = torch.zeros(1, model.talker.cfg.vocab_size, dtype=torch.bool, device=dev)
    n_gen = torch.zeros(1, dtype=torch.long, device=dev)
    cb0 = generate.choose_cb0(model, logits, seen, n_gen, [params])
    codes: list[torch.Tensor] = []
    decoded = 0
    while int(cb0[0]) != model.eos_id and len(codes) < frames:
        seen[0, cb0[0]] = True
        n_gen += 1
        frame = generate.complete_frames(model, hidden, cb0, [params])
        codes.append(frame[0])
        if len(codes) - decoded >= BASELINE_CHUNK:
            decoded = _baseline_decode(model, codes, decoded, emit)
        if len(codes) >= frames:
            break
        g = len(codes) - 1
        text = prompt.trailing[g] if g < prompt.trailing.shape[0] else prompt.pad
        x = generate.next_inputs(model, frame, text[None])
        logits, hidden = model.talker.step(x, t + n_gen - 1, slot, cache)
        cb0 = generate.choose_cb0(model, logits, seen, n_gen, [params])
    if len(codes) > decoded:
        _baseline_decode(model, codes, decoded, emit)
    return len(codes)


def _baseline_decode(model: Qwen3TTSModel, codes: list[torch.Tensor], decoded: int, emit: Any) -> int:
    start = max(0, decoded - BASELINE_LEFT)
    window = torch.stack(codes[start:]).T[None]  # [1, 16, frames]
    wav = model.codec(window)[0]
    new = (len(codes) - decoded) * FRAME
    emit(wav[-new:].numpy())
    return len(codes)


def baseline_run(model: Qwen3TTSModel, n: int, text: str, frames: int, threads: int, seed0: int) -> dict[str, Any]:
    """N requests arriving together, served one at a time on one thread (as the engine core is)."""
    results: list[dict[str, Any]] = []

    def serve() -> None:
        torch.set_num_threads(threads)
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n):
            arrivals: list[float] = []
            sizes: list[int] = []

            def emit(pcm: np.ndarray, a: list[float] = arrivals, s: list[int] = sizes) -> None:
                a.append(time.perf_counter() - t0)
                s.append(pcm.size)

            baseline_one(model, text, seed0 + i, frames, emit)
            results.append({"arrivals": arrivals, "sizes": sizes, "end": StreamEnd("done"),
                            "t_end": time.perf_counter() - t0})
        results.append({"wall": time.perf_counter() - t0, "cpu": time.thread_time() - c0})

    worker = threading.Thread(target=serve)
    worker.start()
    worker.join()
    totals = results.pop()
    return summarize_run(results, totals["wall"], totals["cpu"])


# ---- metrics -------------------------------------------------------------------------------------
def summarize_run(results: list[dict[str, Any]], wall: float, cpu: float) -> dict[str, Any]:
    frames = sum(sum(r["sizes"]) for r in results) / FRAME
    ttfa = [r["arrivals"][0] for r in results if r["arrivals"]]
    rtf = [r["t_end"] / (sum(r["sizes"]) / RATE) for r in results if r["sizes"]]
    players = [pausing_player(r["arrivals"], r["sizes"], RATE) for r in results if r["sizes"]]
    return {
        "streams": len(results),
        "ended_done": sum(1 for r in results if r["end"] is not None and r["end"].reason == "done"),
        "frames": frames,
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "cpu_s": cpu,
        "frames_per_cpu_s": frames / cpu if cpu > 0 else None,
        "load_average": os.getloadavg()[0],
        "rtf_p50": statistics.median(rtf) if rtf else None,
        "ttfa_p50_s": percentile(ttfa, 50),
        "ttfa_p95_s": percentile(ttfa, 95),
        "underruns": sum(p.underruns for p in players),
        "streams_with_underruns": sum(1 for p in players if p.underruns),
        "stall_s": sum(p.stall_s for p in players),
    }


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'N':>3} {'load':>4} | {'f/s':>6} {'f/cpu-s':>7} {'RTF':>5} {'TTFA p50':>8} {'p95':>6} {'undr':>4} "
            f"{'cancel/cycle ms':>15} | {'f/s':>6} {'f/cpu-s':>7} {'TTFA p50':>8} {'p95':>6} {'undr':>4} "
            f"| {'×base1 wall':>11} {'cpu':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        e, b, c = r["engine"], r["baseline"], r["cancel"]
        print(f"{r['n']:>3} {e['load_average']:>4.1f} | {e['frames_per_s']:>6.1f} "
              f"{_fmt(e['frames_per_cpu_s'], '.1f'):>7} {_fmt(e['rtf_p50'], '.2f'):>5} "
              f"{_fmt(e['ttfa_p50_s'], '.3f'):>8} {_fmt(e['ttfa_p95_s'], '.3f'):>6} {e['underruns']:>4} "
              f"{_fmt(c.get('core_max_ms'), '.1f'):>7}/{_fmt(c.get('cycle_max_ms'), '.1f'):<7} | "
              f"{b['frames_per_s']:>6.1f} {_fmt(b.get('frames_per_cpu_s'), '.1f'):>7} "
              f"{_fmt(b['ttfa_p50_s'], '.3f'):>8} {_fmt(b['ttfa_p95_s'], '.3f'):>6} {b['underruns']:>4} "
              f"| {r['speedup_vs_baseline_1']:>11.1f} {_fmt(r.get('cpu_speedup_vs_baseline_1'), '.1f'):>5}")


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ns = [r["n"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for who, style in (("engine", "o-"), ("baseline", "s--")):
        ax1.plot(ns, [r[who]["ttfa_p95_s"] for r in rows], style, label=who)
        ax2.plot(ns, [r[who]["underruns"] for r in rows], style, label=who)
    for ax, title in ((ax1, "time to first audio p95 (s)"), (ax2, "underruns (all streams)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", default=CONCURRENCY)
    ap.add_argument("--frames", type=int, default=100, help="frames per stream (the cap; 12.5 frames = 1 s)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (engine core and baseline)")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--png", type=Path, default=REPO / "bench" / "out" / "engine.png")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra load_engine option, e.g. max_codec_rows=4 (value parsed as JSON when it can be)")
    ap.add_argument("--smoke", action="store_true", help="concurrency 1,2 and 8 frames: checks the harness runs")
    ap.add_argument("--talker", default=None, metavar="native,vllm",
                    help="these talker backends side by side instead (bench/talker_bench.py, its own options)")
    ap.add_argument("--process", action="store_true", help="in-process vs child process (module docstring)")
    ap.add_argument("--relay-compare", action="store_true",
                    help="with --process: a third side, the child relay as it was (one zmq send per event)")
    ap.add_argument("--repeats", type=int, default=1, help="with --process: runs of each side at each level")
    args = ap.parse_args(argv)
    if args.talker:
        from talker_bench import main as talker_main

        return talker_main(sys.argv[1:] if argv is None else argv)
    if args.process and args.concurrency == CONCURRENCY:
        args.concurrency = "1,16,32"
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.smoke:
        levels, args.frames = [1, 2], 8
    max_n = max(levels)
    t = time.perf_counter()
    extra: dict[str, Any] = {}
    for item in args.engine_option:
        key, _, value = item.partition("=")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    options = dict(max_streams=max_n, threads=args.threads, max_frames=args.frames,
                   max_context=max(256, 64 * math.ceil((args.frames + 160) / 64)), **extra)
    if args.process:
        return process_main(args, levels, options)
    eng = load_engine(args.model, **options)
    assert isinstance(eng, Qwen3Engine)
    per_slot = eng.core.bytes_per_slot()
    print(f"model {args.model}: loaded and warmed in {time.perf_counter() - t:.1f} s; "
          f"{sum(per_slot.values())} bytes per slot {per_slot}; "
          f"{args.threads} thread(s), {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    text = bench_text(eng.model, args.frames)
    rows: list[dict[str, Any]] = []
    base1: float | None = None
    base1_cpu: float | None = None
    try:
        for i, n in enumerate(levels):
            e = asyncio.run(engine_run(eng, n, text, seed0=1000 * i))
            c = asyncio.run(engine_cancels(eng, n, text, seed0=1000 * i + 500))
            b = (baseline_run(eng.model, n, text, args.frames, args.threads, seed0=1000 * i) if not args.no_baseline
                 else {"frames_per_s": float("nan"), "ttfa_p50_s": None, "ttfa_p95_s": None, "underruns": 0,
                       "frames_per_cpu_s": None})
            if base1 is None:
                base1, base1_cpu = b["frames_per_s"], b.get("frames_per_cpu_s")
            rows.append({"n": n, "engine": e, "cancel": c, "baseline": b,
                         "speedup_vs_baseline_1": e["frames_per_s"] / base1 if base1 else float("nan"),
                         "cpu_speedup_vs_baseline_1": (e["frames_per_cpu_s"] / base1_cpu
                                                       if base1_cpu and e["frames_per_cpu_s"] else None)})
            print(f"  N={n}: engine {e['frames_per_s']:.1f} f/s, baseline {b['frames_per_s']:.1f} f/s", flush=True)
    finally:
        eng.close()
    print()
    print_table(rows)
    out = {"model": args.model, "frames_per_stream": args.frames, "threads": args.threads, "engine_options": extra,
           "cpu_count": os.cpu_count(), "load_average": os.getloadavg()[0],
           "bytes_per_slot": per_slot, "max_context": eng.config.max_context,
           "baseline": {"chunk": BASELINE_CHUNK, "left_context": BASELINE_LEFT},
           "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, default=float))
    print(f"\nwrote {args.json}" + (f" and {args.png}" if plot(rows, args.png) else " (no matplotlib: no PNG)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
