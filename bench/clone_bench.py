"""Cloned voices on a Qwen3 Base checkpoint: what a reference clip costs, and when speech starts.

For each reference length, in one run on one engine:

- voice making: a clip's first use (decode, x-vector, and for ICL the codec encoder and the decoder
  priming, on the engine's voice-maker thread) against a cached clip: open → first audio with the
  whole text at once;
- time to first audio with text streamed word by word at `--pace` words/s (an LLM still writing),
  for an x-vector clone (no transcript: starts with the first words) and an ICL clone (transcript:
  waits until the text covers the reference frames, see docs/engine.md), from the first word.

    python bench/clone_bench.py [--model tiny-base|PATH] [--refs 3,5,10] [--pace 20] [--json OUT] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine import AudioChunk, StreamEnd, load_engine  # noqa: E402
from engine.qwen3.serving.qwen3_engine import Qwen3Engine  # noqa: E402

TRANSCRIPT = "Thanks for calling, this is the reference recording for my voice."
REPLY = ("Sure, I can help with that. Your order shipped yesterday and should arrive on Friday, "
         "and I have sent the tracking link to your email. ")


def reference(seconds: float, seed: int) -> bytes:
    """A voiced synthetic clip (a wobbling tone plus noise) as WAV bytes; `seed` makes each one new."""
    rate = 24000
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    f0 = 140 + 40 * rng.random()
    wav = 0.3 * np.sin(2 * np.pi * f0 * t + 3 * np.sin(2 * np.pi * 2 * t)) + 0.02 * rng.standard_normal(t.shape)
    buf = io.BytesIO()
    soundfile.write(buf, wav.astype(np.float32), rate, format="WAV")
    return buf.getvalue()


async def first_audio(engine: Qwen3Engine, words: list[str], pace: float | None, **options: Any) -> float:
    """Seconds from the first word to the first audio; `pace` None: the whole text at once."""
    stream = engine.open_stream(None, "en", **options)
    t0 = time.perf_counter()

    async def feed() -> None:
        for word in words:
            stream.append(word + " ")
            if pace:
                await asyncio.sleep(1 / pace)
        stream.finish()

    feeder = asyncio.create_task(feed())
    ttfa = None
    async for ev in stream.events():
        if ttfa is None and isinstance(ev, AudioChunk):
            ttfa = time.perf_counter() - t0
            stream.cancel()  # the first audio is what is timed: the rest of the reply would only cost time
        if isinstance(ev, StreamEnd):
            assert ev.reason in ("done", "cancelled"), ev.message
    feeder.cancel()
    await asyncio.gather(feeder, return_exceptions=True)
    assert ttfa is not None
    return ttfa


async def run(engine: Qwen3Engine, refs: list[float], pace: float, repeats: int) -> list[dict[str, Any]]:
    words = REPLY.split()
    rows = []
    for i, seconds in enumerate(refs):
        clip = reference(seconds, seed=i)
        row: dict[str, Any] = {"ref_s": seconds}
        for name, text in (("xvector", None), ("icl", TRANSCRIPT)):
            fresh = reference(seconds, seed=1000 + 10 * i + (name == "icl"))
            row[f"{name}_first_use_s"] = await first_audio(engine, words, None, ref_audio=fresh, ref_text=text)
            row[f"{name}_cached_s"] = await first_audio(engine, words, None, ref_audio=fresh, ref_text=text)
            streamed = [await first_audio(engine, words, pace, ref_audio=clip, ref_text=text)
                        for _ in range(repeats)]
            row[f"{name}_streamed_ttfa_s"] = statistics.median(streamed)
        row["ref_frames"] = int(np.ceil(seconds * 12.5))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-base")
    ap.add_argument("--refs", default="3,5,10", help="reference lengths in seconds")
    ap.add_argument("--pace", type=float, default=20.0, help="streamed words per second")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "clone.json"))
    ap.add_argument("--smoke", action="store_true", help="one 2 s reference, one repeat")
    args = ap.parse_args(argv)
    refs = [2.0] if args.smoke else [float(x) for x in args.refs.split(",")]
    repeats = 1 if args.smoke else args.repeats
    engine = load_engine(args.model, frames_per_token=2.0, min_frames=6)  # short utterances: TTFA is the point
    assert isinstance(engine, Qwen3Engine)
    if not engine.supports_cloning:
        raise SystemExit(f"{args.model} cannot clone voices (a Qwen3 Base checkpoint can; try tiny-base)")
    try:
        rows = asyncio.run(run(engine, refs, args.pace, repeats))
    finally:
        engine.close()
    head = (f"{'ref s':>5} {'frames':>6} | {'x-vector: 1st use':>17} {'cached':>6} {'streamed TTFA':>13} | "
            f"{'ICL: 1st use':>12} {'cached':>6} {'streamed TTFA':>13}")
    print(f"model {args.model}, text streamed at {args.pace:g} words/s; seconds")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['ref_s']:>5.1f} {r['ref_frames']:>6} | {r['xvector_first_use_s']:>17.3f} "
              f"{r['xvector_cached_s']:>6.3f} {r['xvector_streamed_ttfa_s']:>13.3f} | "
              f"{r['icl_first_use_s']:>12.3f} {r['icl_cached_s']:>6.3f} {r['icl_streamed_ttfa_s']:>13.3f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "pace_words_per_s": args.pace, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
