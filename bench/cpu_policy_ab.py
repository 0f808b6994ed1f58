"""Keep-or-remove A/B of the CPU scheduling heuristics (engine/cpu/policy.py), in process, side by side.

One Piper engine per variant (the same 2 workers each, loaded together), each variant with one of the
policy's heuristics switched off through `CpuPolicyConfig` alone. Rounds interleave the variants in a
shuffled order, so a shared box's load falls on all of them alike; each round sends every variant the
same burst of replies: Poisson arrivals at `--rate`, half sent whole (one stream), half sentence by
sentence (one stream per sentence, each opened as an LLM at `--units-per-s` would finish it, all of one
listener: the engine links them). Per reply: time to first audio from its first text, and whether a
player that starts at the first chunk and never pauses hears a gap (> 50 ms late). Prints a table of
ratios to the baseline and writes JSON.

    python bench/cpu_policy_ab.py --rounds 3 --replies 6 --rate 1.5 --json bench/results/cpu_policy_ab_s23.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine import AudioChunk, StreamEnd, load_engine  # noqa: E402
from engine.cpu.policy import DEFAULT, CpuPolicyConfig  # noqa: E402

VARIANTS: dict[str, CpuPolicyConfig] = {
    "baseline": DEFAULT,
    "baseline_again": DEFAULT,  # A/A: the same policy on its own engine, to read the noise
    "no_hold": dataclasses.replace(DEFAULT, first_hold_s=0.0),  # first audio goes as soon as it is made
    "no_ramp": dataclasses.replace(DEFAULT, ramp_share=1e9),  # pieces are not cut to the audio ahead
    "no_share_cut": dataclasses.replace(DEFAULT, share_min_cost=10**9),  # nor to the stream's part of the workers
    "no_yield": dataclasses.replace(DEFAULT, yield_min_s=1e9),  # no run gives its worker up
    "no_guard": dataclasses.replace(DEFAULT, guard_min_s=0.0, guard_jobs=0.0),  # newcomers first unless past due
    "no_splitter_vote": dataclasses.replace(DEFAULT, splitters_per_group=0),  # no listener's habit remembered
}
REPLIES = [
    ["Sure, I can help with that.", "Your order left the warehouse this morning.",
     "It should arrive by Thursday."],
    ["Well...", "I guess that could work.", "Let me check the calendar for you."],
    ["Thanks for waiting.", "I checked your account, and the refund went out today.",
     "It usually takes three to five business days."],
    ["Doctor Smith will see you at three.", "Please bring your insurance card.", "Anything else?"],
]
LATE_S = 0.05  # a chunk this late is not heard as a gap


async def reply(engine: Any, sentences: list[str], split: bool, listener: str, units_per_s: float,
                rate: int) -> dict[str, Any]:
    """One reply; its first audio from its first text, and its worst lateness against a player that starts
    at its first chunk and never pauses."""
    t0 = time.perf_counter()
    arrivals: list[tuple[float, int]] = []  # (when, samples), in play order

    async def read(stream: Any) -> list[tuple[float, int]]:
        got = []
        async for ev in stream.events():
            if isinstance(ev, StreamEnd):
                assert ev.reason == "done", ev
                break
            if isinstance(ev, AudioChunk):
                got.append((time.perf_counter(), ev.pcm.size))
        return got

    if not split:
        stream = engine.open_stream("joe", "en")
        for text in sentences:
            stream.append(text + " ")
        stream.finish()
        arrivals = await read(stream)
    else:
        readers = []
        for i, text in enumerate(sentences):
            if i:  # the LLM writes the next sentence: about one word piece per unit
                await asyncio.sleep(len(text.split()) / units_per_s)
            stream = engine.open_stream("joe", "en", listener=listener, listener_group="ab")
            stream.append(text)
            stream.finish()
            readers.append(asyncio.create_task(read(stream)))
        for got in await asyncio.gather(*readers):
            arrivals += got
    start = arrivals[0][0]
    played, late = 0, 0.0
    for at, samples in arrivals:
        late = max(late, at - (start + played / rate))
        played += samples
    return {"ttfa_s": start - t0, "late_s": late, "split": split}


async def burst(engine: Any, plan: list[tuple[float, int, bool]], round_no: int, units: float) -> list[dict[str, Any]]:
    t0 = time.perf_counter()

    async def one(i: int, at: float, which: int, split: bool) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        return await reply(engine, REPLIES[which], split, f"r{round_no}-{i}", units, engine.sample_rate)

    return await asyncio.gather(*(one(i, at, which, split) for i, (at, which, split) in enumerate(plan)))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttfa = sorted(r["ttfa_s"] for r in rows)
    p95 = ttfa[min(len(ttfa) - 1, int(0.95 * len(ttfa)))]
    gapped = [r for r in rows if r["late_s"] > LATE_S]
    return {"replies": len(rows), "ttfa_p50_s": statistics.median(ttfa), "ttfa_p95_s": p95,
            "gap_free": 1 - len(gapped) / len(rows),
            "gap_free_sentence": 1 - sum(r["split"] for r in gapped) / max(1, sum(r["split"] for r in rows)),
            "gap_free_whole": 1 - sum(not r["split"] for r in gapped) / max(1, sum(not r["split"] for r in rows)),
            "late_max_s": max(r["late_s"] for r in rows)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    names = [n for n in args.variants.split(",") if n]
    engines = {n: load_engine("piper", workers=args.workers, config=VARIANTS[n]) for n in names}
    rng = random.Random(args.seed)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    try:
        for r in range(args.rounds):
            at, plan = 0.0, []
            for i in range(args.replies):  # the same burst for every variant of this round
                plan.append((at, rng.randrange(len(REPLIES)), i % 2 == 1))
                at += rng.expovariate(args.rate)
            order = names[:]
            rng.shuffle(order)
            for n in order:
                rows[n] += await burst(engines[n], plan, r, args.units_per_s)
                print(f"round {r + 1}/{args.rounds} {n}: {summary(rows[n])}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    out = {n: summary(v) for n, v in rows.items()}
    base = out.get("baseline")
    print(f"\n{'variant':18} {'TTFA p50':>9} {'p95':>7} {'gap-free':>9} {'sentence':>9} {'whole':>7}"
          "  vs baseline: p95, gap-free")
    for n, s in out.items():
        rel = "" if base is None else (f"  {s['ttfa_p95_s'] / base['ttfa_p95_s']:.2f}x, "
                                       f"{s['gap_free'] - base['gap_free']:+.2f}")
        print(f"{n:18} {s['ttfa_p50_s']:9.2f} {s['ttfa_p95_s']:7.2f} {s['gap_free']:9.2f} "
              f"{s['gap_free_sentence']:9.2f} {s['gap_free_whole']:7.2f}{rel}")
    return {"args": vars(args), "summary": out, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replies", type=int, default=6, help="replies per burst")
    p.add_argument("--rate", type=float, default=1.5, help="replies per second within a burst")
    p.add_argument("--units-per-s", type=float, default=20.0, help="LLM pace, words per second")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
