"""What cutting a reply into smaller pieces costs the CPU voices: run time and audio made per piece size.

The CPU engine cuts a stream's text into pool jobs (pieces), smaller while its listener has little audio
ahead or many streams want the workers (engine/cpu/policy.py, `ramp_min_cost`, `share_min_cost`). Each
piece is a model run of its own, with its own edges (leading and trailing silence, Kokoro's padding).
This runs the same text whole and cut at each `--limits` value (engine/cpu/text.py `pieces`, the cutter
the engine uses), each piece through the engine's own job path, one at a time, in rounds that run every
cut in turn, and reports the median run time, the audio made, the RTF, and the run time against the
text's cut at the engine's usual bound (the median of each round's ratio).
Prints a table, writes JSON.

    python bench/piece_cost.py [--backends piper,kokoro] [--limits 120,90,60,48,40,24] [--repeat 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from engine import load_engine  # noqa: E402
from engine.cpu.engine import KOKORO_DEFAULT  # noqa: E402
from engine.cpu.onnx import run_options  # noqa: E402
from engine.cpu.policy import DEFAULT  # noqa: E402
from engine.cpu.text import pieces  # noqa: E402

TEXTS = {
    "piper": ("en", "When your order leaves the warehouse, we will send a message, and the courier will call "
                    "you, before noon tomorrow. Please keep your phone nearby so that we can reach you quickly."),
    "kokoro": ("zh", "今天下午可能会下雨，出门记得带伞。我们明天上午十点在公司门口集合，然后一起去参观新的工厂。"),
}  # fmt: skip
VOICES = {"piper": "joe", "kokoro": KOKORO_DEFAULT}


def one_pass(engine: Any, backend: str, parts: list[str]) -> tuple[float, float]:
    """Run time and audio seconds of `parts`, one after another, each through the engine's own job path
    (`CpuEngine.synthesise`: the model runs, the gain and the trim of each run's edges)."""
    lang = TEXTS[backend][0]
    voice = engine._voices[VOICES[backend]]
    t0, audio_s = time.perf_counter(), 0.0
    for part in parts:
        for pcm, rate, _ in engine.synthesise(voice, lang, part, 1.0, threading.Event(), run_options()):
            audio_s += pcm.size / rate
    return time.perf_counter() - t0, audio_s


def measure(engine: Any, backend: str, limits: list[int], repeat: int) -> list[dict[str, Any]]:
    """One row per bound in `limits`. Each round runs every bound and the usual one (`CpuPolicyConfig.piece_limit`) in
    turn, so a shared box's drift falls on all alike; the ratio to the usual bound is the median of the
    rounds' own ratios."""
    usual = DEFAULT.piece_limit(backend)
    cuts = {limit: list(pieces(TEXTS[backend][1], limit)) for limit in {*limits, usual}}
    runs: dict[int, list[tuple[float, float]]] = {limit: [] for limit in cuts}
    for _ in range(repeat):
        for limit, parts in cuts.items():
            runs[limit].append(one_pass(engine, backend, parts))
    rows = []
    for limit in limits:
        run_s = statistics.median(r for r, _ in runs[limit])
        audio_s = runs[limit][-1][1]
        ratio = statistics.median(r / u for (r, _), (u, _) in zip(runs[limit], runs[usual], strict=True))
        rows.append({"backend": backend, "limit": limit, "pieces": len(cuts[limit]), "run_s": run_s,
                     "audio_s": audio_s, "rtf": run_s / audio_s, "run_vs_usual": ratio})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="piper,kokoro")
    ap.add_argument("--limits", default="120,90,60,48,40,24", help="piece bounds, in text.cost units")
    ap.add_argument("--repeat", type=int, default=5, help="rounds, each running every cut once; medians")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "piece_cost.json")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    engine = load_engine("cpu" if "kokoro" in backends else "piper", workers=1)
    rows: list[dict[str, Any]] = []
    try:
        limits = sorted({int(x) for x in args.limits.split(",")}, reverse=True)
        for backend in backends:
            rows += measure(engine, backend, limits, args.repeat)
    finally:
        engine.close()
    print("| backend | limit | pieces | run s | audio s | RTF | run ÷ usual bound's |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['limit']} | {r['pieces']} | {r['run_s']:.3f} | {r['audio_s']:.2f} | "
              f"{r['rtf']:.3f} | {r['run_vs_usual']:.2f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"repeat": args.repeat, "rows": rows}, indent=1))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
