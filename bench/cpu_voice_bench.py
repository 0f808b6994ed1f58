"""CPU voices benchmark: load time, time to first audio, real-time factor, concurrent real-time streams.

Per voice and language, for a short clause and a long multi-sentence segment: TTFA (append → first
AudioChunk, through the real Stream/EventBridge path) and RTF (wall time to the last chunk ÷ audio
seconds), medians over repeats on a warm engine. Then how many concurrent streams (each a few
sentences, one segment each, appended at once) stay real-time: a stream is real-time when, playing
from its first chunk, no chunk arrives after its play-out time (no underrun). Last, beside long
segments: `workers` streams each speak one 64 KiB segment (what `split_granularity: "none"` commits)
to fast readers, and a short stream's TTFA is measured beside them (segments run in bounded pieces, so
it waits about one piece). Prints a table and writes JSON.

    python bench/cpu_voice_bench.py [--json bench/out/cpu_voices.json] [--repeats 3] [--threads T]
        [--workers N] [--max-streams 8] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine import AudioChunk, StreamEnd, Waiting, load_engine  # noqa: E402

TEXTS = {
    "en": {
        "short": "Sure, I can help with that.",
        "long": ("Thanks for waiting. I checked your account, and the refund went out this morning. "
                 "It usually takes three to five business days to show up on your statement, "
                 "depending on your bank."),
    },
    "zh": {
        "short": "好的，我来帮您处理。",
        "long": ("感谢您的耐心等待。我查看了您的账户，退款已经在今天上午发出。"
                 "通常需要三到五个工作日才能到账，具体取决于您的银行。"),
    },
}
CASES = [("joe", "en"), ("jf_gongitsune", "en"), ("jf_gongitsune", "zh")]
STREAM_SENTENCES = {
    "en": ["Thanks for waiting. ", "I checked your account, and the refund went out this morning. ",
           "It usually takes three to five business days. ", "Is there anything else I can do for you? "],
    "zh": ["感谢您的耐心等待。", "我查看了您的账户，退款已经发出。", "通常需要三到五个工作日。",
           "还有什么可以帮您的吗？"],
}


async def one_stream(engine: Any, voice: str, lang: str, texts: list[str]) -> dict[str, Any]:
    """Run one stream; arrival time and play-out position of every chunk."""
    stream = engine.open_stream(voice, lang)
    t0 = time.perf_counter()
    for t in texts:
        stream.append(t)
    stream.finish()
    arrivals: list[tuple[float, int, int]] = []  # (seconds since append, first_frame, samples)
    rate = engine.sample_rate
    async for ev in stream.events():
        if isinstance(ev, StreamEnd):
            assert ev.reason == "done", ev
            break
        if isinstance(ev, Waiting):  # the pool is saturated: it shows in TTFA and lateness anyway
            continue
        assert isinstance(ev, AudioChunk)
        arrivals.append((time.perf_counter() - t0, ev.first_frame, ev.pcm.size))
        rate = ev.sample_rate
    wall = time.perf_counter() - t0
    audio = sum(n for _, _, n in arrivals) / rate
    ttfa = arrivals[0][0] if arrivals else float("nan")
    # Playback starts when the first chunk arrives; a chunk is late if it arrives after its play time.
    lateness = max((t - (ttfa + f / rate) for t, f, _ in arrivals), default=0.0)
    return {"ttfa_s": ttfa, "wall_s": wall, "audio_s": audio, "rtf": wall / audio if audio else None,
            "max_late_s": max(0.0, lateness)}


async def single(engine: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for voice, lang in CASES:
        for length, text in TEXTS[lang].items():
            runs = [await one_stream(engine, voice, lang, [text]) for _ in range(repeats)]
            rows.append({
                "voice": voice, "language": lang, "segment": length,
                "ttfa_ms": 1000 * statistics.median(r["ttfa_s"] for r in runs),
                "rtf": statistics.median(r["rtf"] for r in runs),
                "audio_s": statistics.median(r["audio_s"] for r in runs),
            })
    return rows


async def concurrency(engine: Any, voice: str, lang: str, max_streams: int) -> dict[str, Any]:
    """The most concurrent streams with no underrun (tolerance 50 ms), growing 1, 2, 3, 4, 6, 8…"""
    best, trials = 0, []
    n = 1
    while n <= max_streams:
        results = await asyncio.gather(*(one_stream(engine, voice, lang, STREAM_SENTENCES[lang])
                                         for _ in range(n)))
        late = max(r["max_late_s"] for r in results)
        trials.append({"streams": n, "max_late_s": late,
                       "ttfa_ms_median": 1000 * statistics.median(r["ttfa_s"] for r in results),
                       "ttfa_ms_max": 1000 * max(r["ttfa_s"] for r in results)})
        if late > 0.05:
            break
        best = n
        n = n + 1 if n < 4 else n + 2
    return {"voice": voice, "language": lang, "realtime_streams": best, "trials": trials}


def long_text(lang: str, chars: int = 65000) -> str:
    """About `chars` characters of varied sentences (English) or Han text (Mandarin)."""
    if lang == "en":
        parts = [f"Sentence {i} tells the listener about parcel {i * 7 % 1000} and why it matters today. "
                 for i in range(chars // 70 + 1)]  # fmt: skip
        return "".join(parts)[:chars]
    base = TEXTS["zh"]["long"]
    return (base * (chars // len(base) + 1))[:chars]


async def beside_long(engine: Any, voice: str, lang: str, repeats: int) -> dict[str, Any]:
    """A short stream's TTFA while `workers` streams speak one 64 KiB segment each."""
    text = long_text(lang)
    big = [engine.open_stream(voice, lang) for _ in range(engine.workers)]
    heard = [0] * len(big)

    async def read(i: int, stream: Any) -> None:
        async for ev in stream.events():
            if isinstance(ev, AudioChunk):
                heard[i] += ev.pcm.size

    for stream in big:
        stream.append(text)
        stream.finish()
    readers = [asyncio.create_task(read(i, st)) for i, st in enumerate(big)]
    ttfas: list[float] = []
    notices = 0
    try:
        while not all(heard):
            await asyncio.sleep(0.01)
        for _ in range(repeats):
            short = engine.open_stream(voice, lang)
            t0 = time.perf_counter()
            short.append(TEXTS[lang]["short"])
            short.finish()
            first = None
            async for ev in short.events():
                if isinstance(ev, Waiting):
                    notices += 1
                elif isinstance(ev, AudioChunk) and first is None:
                    first = time.perf_counter() - t0
            ttfas.append(first if first is not None else float("nan"))
    finally:
        for stream in big:
            stream.cancel()
        await asyncio.gather(*readers)
    return {"voice": voice, "language": lang, "long_streams": len(big), "long_chars": len(text),
            "ttfa_ms_median": 1000 * statistics.median(ttfas), "ttfa_ms_max": 1000 * max(ttfas),
            "waiting_notices": notices}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "cpu_voices.json"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="onnxruntime intra-op threads per model run (default: the engine's)")
    ap.add_argument("--workers", type=int, default=None, help="synthesis pool size (default: cores)")
    ap.add_argument("--max-streams", type=int, default=8)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--smoke", action="store_true", help="one repeat, concurrency up to 2 (CI smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.max_streams = 1, 2

    t0 = time.perf_counter()
    engine = load_engine("cpu", cache_dir=args.cache_dir, threads=args.threads, workers=args.workers)
    load_total = time.perf_counter() - t0
    rss_loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        rows = asyncio.run(single(engine, args.repeats))
        conc = [asyncio.run(concurrency(engine, v, lang, args.max_streams)) for v, lang in CASES]
        beside = [asyncio.run(beside_long(engine, v, lang, args.repeats)) for v, lang in CASES]
    finally:
        engine.close()

    print(f"load {engine.load_seconds:.2f} s + warm-up {engine.warmup_seconds:.2f} s "
          f"(load_engine total {load_total:.2f} s); {engine.workers} workers × {engine.threads} threads, "
          f"{os.cpu_count()} cores; peak RSS {rss_loaded_mb:.0f} MB after load, "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB at the end")
    print(f"{'voice':<15}{'lang':<6}{'segment':<9}{'TTFA ms':>9}{'RTF':>7}{'audio s':>9}")
    for r in rows:
        print(f"{r['voice']:<15}{r['language']:<6}{r['segment']:<9}{r['ttfa_ms']:>9.0f}{r['rtf']:>7.3f}"
              f"{r['audio_s']:>9.2f}")
    print(f"{'voice':<15}{'lang':<6}{'real-time streams':>18}   trials (streams: max late s)")
    for c in conc:
        trials = ", ".join(f"{t['streams']}: {t['max_late_s']:.2f}" for t in c["trials"])
        print(f"{c['voice']:<15}{c['language']:<6}{c['realtime_streams']:>18}   {trials}")
    print(f"{'voice':<15}{'lang':<6}{'beside N × 64 KiB':>18}{'TTFA ms median':>16}{'max':>8}{'Waiting':>9}")
    for b in beside:
        print(f"{b['voice']:<15}{b['language']:<6}{b['long_streams']:>18}{b['ttfa_ms_median']:>16.0f}"
              f"{b['ttfa_ms_max']:>8.0f}{b['waiting_notices']:>9}")

    out = {"load_s": engine.load_seconds, "warmup_s": engine.warmup_seconds,
           "load_engine_total_s": load_total, "rss_loaded_mb": rss_loaded_mb,
           "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "workers": engine.workers, "threads": engine.threads, "cores": os.cpu_count(),
           "single": rows, "concurrency": conc, "beside_long_segments": beside}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
