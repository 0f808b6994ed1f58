"""Segmentation benchmark: voxgate's StreamSegmenter against the peers' rules, side by side.

For each segmenter, mode and language of the corpus: false splits, missed sentence ends, commit lag
after a boundary (non-space characters with 1-character deltas; deltas with LLM-token deltas), cost
per delta and throughput. Prints a table and writes JSON.

    python bench/segmentation_bench.py [--json bench/out/segmentation.json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]

from segmentation_peers import SEGMENTERS  # noqa: E402
from support.segcases import Case, char_deltas, clause_ends, load_cases, sentence_ends, word_deltas  # noqa: E402

from segmentation.segmenter import warm_up  # noqa: E402

CLAUSE_SEGMENTERS = ("voxgate/clause", "voxgate/auto", "vllm-omni/clause")


def replay(name: str, deltas: list[str]) -> list[tuple[int, int]]:
    """(commit offset, index of the delta that committed it); flush counts as one more delta."""
    seg = SEGMENTERS[name]()
    out = []
    for i, d in enumerate(deltas):
        out += [(e, i) for e in seg.feed(d)]
    out += [(e, len(deltas)) for e in seg.flush()]
    return out


def delta_index_of(deltas: list[str], offset: int) -> int:
    pos = 0
    for i, d in enumerate(deltas):
        pos += len(d)
        if pos > offset:
            return i
    return len(deltas)


def quality(name: str, cases: list[Case], seeds: int) -> dict[str, Any]:
    clause = name in CLAUSE_SEGMENTERS  # clause marks are allowed split points for these
    false_splits = missed = boundaries = 0
    lag_chars: list[int] = []
    lag_deltas: list[int] = []
    for case in cases:
        text = case.text
        ends = sentence_ends(case)
        allowed = ends | (clause_ends(text) if clause else set())
        schedules = [list(text), list(word_deltas(text))]
        schedules += [list(char_deltas(text, random.Random(s))) for s in range(seeds)]
        for si, deltas in enumerate(schedules):
            commits = replay(name, deltas)
            split = {e for e, _ in commits if e < len(text)}
            false_splits += len(split - allowed)
            missed += len(ends - split)
            boundaries += len(ends)
            for e, i in commits:
                if e not in ends:
                    continue
                if si == 0:  # one character per delta: lag in non-space characters received
                    received = text[e : i + 1]
                    lag_chars.append(sum(1 for c in received if not c.isspace()))
                elif si == 1:  # LLM tokens: lag in deltas after the one carrying the next character
                    lag_deltas.append(i - delta_index_of(deltas, e))
    return {
        "false_splits": false_splits,
        "missed_sentence_ends": missed,
        "boundaries": boundaries,
        "lag_chars_mean": statistics.fmean(lag_chars) if lag_chars else None,
        "lag_chars_p95": _pct(lag_chars, 95),
        "lag_chars_max": max(lag_chars) if lag_chars else None,
        "lag_deltas_mean": statistics.fmean(lag_deltas) if lag_deltas else None,
        "lag_deltas_p95": _pct(lag_deltas, 95),
    }


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def speed(name: str, cases: list[Case], repeat: int) -> dict[str, Any]:
    """Cost of each feed() on LLM-token deltas, and throughput over a long stream."""
    text = "".join(c.text + ("\n" if i % 5 == 4 else " ") for i, c in enumerate(cases))
    deltas = list(word_deltas(text))
    costs: list[float] = []
    nbytes = 0
    total = 0.0
    for _ in range(repeat):
        seg = SEGMENTERS[name]()
        for d in deltas:
            t0 = time.perf_counter_ns()
            seg.feed(d)
            dt = time.perf_counter_ns() - t0
            costs.append(dt / 1000)
            total += dt
        seg.flush()
        nbytes += len(text.encode())
    return {
        "deltas": len(costs),
        "cost_us_p50": _pct(costs, 50),
        "cost_us_p99": _pct(costs, 99),
        "cost_us_max": max(costs),
        "throughput_mb_s": nbytes / (total / 1e9) / 1e6,
    }


def one_big_delta(mb: float) -> dict[str, float]:
    """voxgate only: one delta of `mb` megabytes (must be linear)."""
    from segmentation import StreamSegmenter

    cases = load_cases()
    unit = "".join(c.text + " " for c in cases)
    out = {}
    for size in (mb / 10, mb):
        text = (unit * (int(size * 1e6) // len(unit.encode()) + 1))[: int(size * 1e6 / 1.3)]
        seg = StreamSegmenter(granularity="clause")
        t0 = time.perf_counter()
        n = len(seg.feed(text)) + len(seg.flush())
        dt = time.perf_counter() - t0
        out[f"{len(text.encode()) / 1e6:.2f}MB_seconds"] = dt
        out[f"{len(text.encode()) / 1e6:.2f}MB_segments"] = n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "segmentation.json"))
    ap.add_argument("--smoke", action="store_true", help="fewer repeats (CI)")
    args = ap.parse_args()
    warm_up()
    cases = load_cases()
    seeds, repeat = (2, 3) if args.smoke else (8, 30)
    by_lang: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_lang[c.lang].append(c)
    results: dict[str, Any] = {"cases": len(cases), "segmenters": {}}
    header = (
        f"{'segmenter':20} {'lang':4} {'false':>5} {'missed':>6} {'/bound':>6} {'lag ch mean':>11} "
        f"{'p95':>4} {'lag Δ mean':>10} {'p95':>4}"
    )
    print(header)
    print("-" * len(header))
    for name in SEGMENTERS:
        per_lang = {}
        for lang in ("en", "zh", "mix", "all"):
            subset = cases if lang == "all" else by_lang[lang]
            q = quality(name, subset, seeds)
            per_lang[lang] = q
            print(
                f"{name:20} {lang:4} {q['false_splits']:5d} {q['missed_sentence_ends']:6d} "
                f"{q['boundaries']:6d} {_f(q['lag_chars_mean']):>11} {_f(q['lag_chars_p95']):>4} "
                f"{_f(q['lag_deltas_mean']):>10} {_f(q['lag_deltas_p95']):>4}"
            )
        results["segmenters"][name] = {"quality": per_lang, "speed": speed(name, cases, repeat)}
    print()
    header = f"{'segmenter':20} {'deltas':>7} {'µs p50':>7} {'µs p99':>7} {'µs max':>8} {'MB/s':>7}"
    print(header)
    print("-" * len(header))
    base = results["segmenters"]["vllm-omni/sentence"]["speed"]["cost_us_p99"]
    for name, r in results["segmenters"].items():
        s = r["speed"]
        print(
            f"{name:20} {s['deltas']:7d} {s['cost_us_p50']:7.2f} {s['cost_us_p99']:7.2f} "
            f"{s['cost_us_max']:8.1f} {s['throughput_mb_s']:7.2f}  p99 ×{s['cost_us_p99'] / base:.2f} of vllm"
        )
    results["one_big_delta"] = one_big_delta(0.2 if args.smoke else 1.0)
    print("\none delta, voxgate/clause:", {k: round(v, 3) for k, v in results["one_big_delta"].items()})
    ours = results["segmenters"]["voxgate/sentence"]["quality"]["all"]
    results["targets"] = {
        "zero_false_splits": all(
            results["segmenters"][n]["quality"]["all"]["false_splits"] == 0
            for n in ("voxgate/sentence", "voxgate/clause", "voxgate/auto")
        ),
        "zero_missed_sentence_ends": ours["missed_sentence_ends"] == 0,
        "lag_at_most_one_char": (ours["lag_chars_max"] or 0) <= 1,
        "p99_cost_at_most_50us": all(
            results["segmenters"][n]["speed"]["cost_us_p99"] <= 50
            for n in ("voxgate/sentence", "voxgate/clause", "voxgate/auto")
        ),
    }
    print("targets:", results["targets"])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
