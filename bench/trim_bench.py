"""What the leading-silence trim wins: audible time to first audio with the trim on and off.

Two gateways on loopback serve the same engine, one with the default trim, one without. Each short
reply is spoken one at a time (no load: the trim's gain, not queueing, is measured), alternating
between the two. For each it records the server's timing record (`session.done.timing`) and, on the
client, the time from `input.done` until a player starting at the first frame plays the first audible
sample (the RMS onset of bench/load.py), and that sample's position in the audio received. Prints a table, writes JSON.

    python bench/trim_bench.py [--model piper] [--language en] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.servers import serve  # noqa: E402
from support.wsclient import open_session  # noqa: E402

from engine import load_engine  # noqa: E402
from engine.audio import OnsetTracker  # noqa: E402
from gateway.connection import Limits  # noqa: E402

TEXTS = {
    "en": ["Sure.", "Hello there!", "Your package will arrive on Monday afternoon.", "Please hold.",
           "Thank you for calling, how can I help you today?", "I have booked a table for two."],
    "zh": ["好的。", "您好！", "您的包裹将在周一下午送达。", "请稍等。", "感谢您的来电。", "我已经为您预订了座位。"],
}  # fmt: skip


async def reply(addr: str, text: str, language: str) -> dict[str, Any]:
    ws, ready = await open_session(addr, language=language, voice=None)
    rate = ready["sample_rate"]
    onset = OnsetTracker(rate)
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "input.done"}))
    received, audible_s = 0, None
    arrivals: list[tuple[int, float]] = []  # (end sample, arrival) of each frame
    while True:
        m = await asyncio.wait_for(ws.recv(), 60)
        now = time.perf_counter() - t0
        if isinstance(m, bytes):
            received += len(m) // 2
            arrivals.append((received, now))
            if audible_s is None and (k := onset.feed(np.frombuffer(m, np.int16))) is not None:
                # As the server counts it: a player starting at the first frame plays sample k after
                # k / rate, unless the frame holding it came later.
                held_at = next(t for end, t in arrivals if end > k)
                audible_s = max(held_at, arrivals[0][1] + k / rate)
            continue
        ev = json.loads(m)
        if ev["type"] == "session.done":
            await ws.close()
            return {"timing": ev["timing"], "client_audible_ms": None if audible_s is None else audible_s * 1000,
                    "onset_ms": None if onset.onset is None else onset.onset * 1000 / rate}  # fmt: skip


def median(rows: list[dict[str, Any]], key: Any) -> float | None:
    xs = [v for v in (key(r) for r in rows) if v is not None]
    return statistics.median(xs) if xs else None


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="piper")
    ap.add_argument("--language", default="en", choices=sorted(TEXTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    engine = load_engine(args.model)
    servers = {"trim": serve(engine, Limits()), "off": serve(engine, Limits(trim_leading_silence=False))}
    addrs = {name: next(gen) for name, gen in servers.items()}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in addrs}
    try:
        for _ in range(args.rounds):
            for text in TEXTS[args.language]:
                for name, addr in addrs.items():
                    rows[name].append(await reply(addr, text, args.language) | {"text": text})
    finally:
        for gen in servers.values():
            next(gen, None)
        engine.close()
    print(f"{args.model} {args.language}, {args.rounds} rounds × {len(TEXTS[args.language])} replies, medians (ms)")
    print(f"{'trim':5} {'trimmed':>8} {'onset in audio':>15} {'server audible TTFA':>20} {'server TTFA':>12} "
          f"{'client audible TTFA':>20} {'silence heard':>14}")  # fmt: skip
    summary: dict[str, dict[str, float | None]] = {}
    for name, rs in rows.items():
        s = summary[name] = {
            "trimmed_ms": median(rs, lambda r: r["timing"]["trimmed_ms"]),
            "onset_in_audio_ms": median(rs, lambda r: r["onset_ms"]),
            "server_audible_ttfa_ms": median(rs, lambda r: r["timing"]["audible_ttfa_ms"]),
            "server_ttfa_ms": median(rs, lambda r: r["timing"]["ttfa_ms"]),
            "client_audible_ttfa_ms": median(rs, lambda r: r["client_audible_ms"]),
            # The silence heard before the first sound: audible TTFA less TTFA, free of the engine's jitter.
            "silence_heard_ms": median(rs, lambda r: r["timing"]["audible_ttfa_ms"] - r["timing"]["ttfa_ms"]),
        }
        cells = [f"{v:.1f}" if v is not None else "-" for v in s.values()]
        print(f"{name:5} {cells[0]:>8} {cells[1]:>15} {cells[2]:>20} {cells[3]:>12} {cells[4]:>20} {cells[5]:>14}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "language": args.language, "rounds": args.rounds,
                                         "summary": summary, "rows": rows}, indent=1, ensure_ascii=False))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
