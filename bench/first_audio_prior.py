"""The CPU engine's word on first audio against what lone streams take on this box.

Admission's first-audio forecast starts, per class of voice, from the engine's word
(`Capacity.first_audio_s`: `first_piece_s` of speech at the backend's measured RTF; docs/admission.md)
and its measurements then correct it: two slow in a row overrule a prior below them, only a few dozen a
prior above. So the word should be near the measured time, and below it rather than above. This loads
the `cpu` engine (warm-up included), then opens one stream at a time, alternating the voices, each with
a typical first reply, and reports per class the word after the warm-up, each lone stream's time from
its open to its first audio, and the word at the end (it moves as the engine measures its runs).
Prints a table, writes JSON.

    python bench/first_audio_prior.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from engine import AudioChunk, StreamEnd, load_engine  # noqa: E402
from engine.cpu.engine import KOKORO_DEFAULT  # noqa: E402

REPLIES = {  # class → (voice, language, a first reply as a voice agent sends it)
    "piper": ("joe", "en", "Thank you for calling. Your appointment is confirmed for Tuesday at three."),
    "kokoro": (KOKORO_DEFAULT, "zh", "好的，我来帮您安排。您的预约已经确认在星期二下午三点。"),
}


async def lone_first_audio(engine: Any, voice: str, language: str, text: str) -> float:
    """Seconds from a stream's open to its first audio, alone on the engine (drained to its end)."""
    t0 = time.perf_counter()
    stream = engine.open_stream(voice, language)
    stream.append(text)
    stream.finish()
    first = None
    async for ev in stream.events():
        if first is None and isinstance(ev, AudioChunk):
            first = time.perf_counter() - t0
        if isinstance(ev, StreamEnd):
            break
    assert first is not None, f"{voice}: no audio"
    return first


async def measure(rounds: int) -> dict[str, Any]:
    engine = load_engine("cpu", workers=2)
    try:
        word_start = dict(engine.capacity().first_audio_s)
        lone: dict[str, list[float]] = {c: [] for c in REPLIES}
        for _ in range(rounds):
            for c, reply in REPLIES.items():
                lone[c].append(await lone_first_audio(engine, *reply))
        word_end = dict(engine.capacity().first_audio_s)
    finally:
        engine.close()
    return {c: {"word_after_warmup_s": word_start[c], "lone_s": lone[c], "lone_median_s": statistics.median(lone[c]),
                "word_at_end_s": word_end[c]} for c in REPLIES}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load = os.getloadavg()
    out = asyncio.run(measure(args.rounds))
    print(f"load average before: {load[0]:.2f}")
    print("| class | word after warm-up s | lone first audio median (min-max) s | word at end s |")
    print("|---|---|---|---|")
    for c, r in out.items():
        print(f"| {c} | {r['word_after_warmup_s']:.2f} | {r['lone_median_s']:.2f} ({min(r['lone_s']):.2f}-"
              f"{max(r['lone_s']):.2f}) | {r['word_at_end_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"load_before": load[0], "classes": out}, indent=1))


if __name__ == "__main__":
    main()
