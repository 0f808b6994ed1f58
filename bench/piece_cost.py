"""What cutting a reply into smaller pieces costs the CPU voices: run time and audio made per piece size.

The CPU engine cuts a stream's text into pool jobs (pieces), smaller while its listener has little audio
ahead or many streams want the workers (engine/cpu/engine.py, `RAMP_MIN_COST`, `SHARE_MIN_COST`). Each
piece is a model run of its own, with its own edges (leading and trailing silence, Kokoro's padding).
This runs the same text whole and cut at each `--limits` value (engine/cpu/text.py `pieces`, the cutter
the engine uses), one run at a time on one thread of the engine's models, and reports the median run
time, the audio made, the RTF, and the run time against the text's cut at the engine's usual bound.
Prints a table, writes JSON.

    python bench/piece_cost.py [--backends piper,kokoro] [--limits 120,90,60,48,40,24] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from engine import load_engine  # noqa: E402
from engine.cpu.engine import KOKORO_DEFAULT, PIECE_LIMITS  # noqa: E402
from engine.cpu.text import pieces  # noqa: E402

TEXTS = {
    "piper": ("en", "When your order leaves the warehouse, we will send a message, and the courier will call "
                    "you, before noon tomorrow. Please keep your phone nearby so that we can reach you quickly."),
    "kokoro": ("zh", "今天下午可能会下雨，出门记得带伞。我们明天上午十点在公司门口集合，然后一起去参观新的工厂。"),
}  # fmt: skip


def measure(engine: Any, backend: str, limit: int, repeat: int) -> dict[str, Any]:
    lang, text = TEXTS[backend]
    parts = list(pieces(text, limit))
    runs, audio_s = [], 0.0
    for _ in range(repeat):
        t0, audio_s = time.perf_counter(), 0.0
        for part in parts:
            if backend == "piper":
                for ids in engine._piper.units(part):
                    audio_s += engine._piper.run(ids).size / engine._piper.sample_rate
            else:
                for tokens in engine._kokoro.units(part, lang):
                    audio_s += engine._kokoro.run(tokens, KOKORO_DEFAULT).size / engine._kokoro.sample_rate
        runs.append(time.perf_counter() - t0)
    run_s = statistics.median(runs)
    return {"backend": backend, "limit": limit, "pieces": len(parts), "run_s": run_s, "audio_s": audio_s,
            "rtf": run_s / audio_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="piper,kokoro")
    ap.add_argument("--limits", default="120,90,60,48,40,24", help="piece bounds, in text.cost units")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each cut; the median is reported")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "piece_cost.json")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    engine = load_engine("cpu" if "kokoro" in backends else "piper", workers=1)
    rows: list[dict[str, Any]] = []
    try:
        for backend in backends:
            usual = measure(engine, backend, PIECE_LIMITS[backend], args.repeat)
            for limit in sorted({int(x) for x in args.limits.split(",")}, reverse=True):
                row = measure(engine, backend, limit, args.repeat)
                row["run_vs_usual"] = row["run_s"] / usual["run_s"]
                rows.append(row)
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
