"""Segmentation benchmark: voxgate's StreamSegmenter against the peers' rules, side by side.

For each segmenter, mode and language of the corpus: false splits, missed sentence ends, commit lag
after a boundary (non-space characters with 1-character deltas; deltas with LLM-token deltas), cost
per delta and throughput. Prints a table and writes JSON.

    python bench/segmentation_bench.py [--json bench/out/segmentation.json] [--smoke]

`--hostile` measures instead what hostile text costs (bench/hostile_text.py): each shape fed to each
granularity at two sizes, in one delta and in 4 KiB slices (as the gateway feeds a big message), then
normalize_for_speech on each normaliser shape. µs per KiB should not grow with the size: the ratio of
the two sizes' times should be near the ratio of the sizes (8), not its square.

    python bench/segmentation_bench.py --hostile [--sizes 128,1024] [--norm-sizes 8,64] [--budget-s 5]

`--baseline DIR` runs the same measures on the `segmentation/` package of another checkout (DIR holds
it, e.g. `git archive main segmentation | tar -x -C /tmp/base`) in a subprocess, then prints voxgate's
rows before and after side by side and writes both under "baseline" and "segmenters". `--code DIR`
(used by that subprocess) imports `segmentation` from DIR instead of this checkout. Besides lag and
cost, each voxgate row counts atom splits: cuts inside a number with what reads it, a time, a date, a
version or a dotted abbreviation, with the LLM stalling (idle timeout passed) after every character.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
if "--code" in sys.argv:  # the segmentation package under test, from another checkout (see --baseline)
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve()))

from hostile_text import NORMALIZER_SHAPES, SEGMENTER_SHAPES  # noqa: E402
from segmentation_peers import SEGMENTERS  # noqa: E402
from support.segcases import Case, char_deltas, clause_ends, load_cases, sentence_ends, word_deltas  # noqa: E402

from segmentation import warm_up  # noqa: E402

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


# What no cut may split, found in the finished text (independent of segmentation/atoms.py): a number
# with its sign or currency, decimals, groups, time or date parts, and the percent, unit or Han
# character that reads it; a version or address; a dotted abbreviation.
_ATOM_ORACLE = re.compile(
    r"[$€£¥￥-]?(?:[A-Za-z]+)?\d+(?:[.,:/-]\d+)*(?:\s?(?:%|°?[A-Za-z]+\b\.?|[\u4e00-\u9fff]))?"
    r"|(?<![A-Za-z])(?:[A-Za-z]\.){2,}"
)


def atom_splits(name: str, cases: list[Case]) -> dict[str, int]:
    """Cuts inside an atom when the LLM stalls (poll() past the idle timeout) after every character."""
    from segmentation import StreamSegmenter

    granularity = name.split("/")[1]
    splits = cuts = 0
    for case in cases:
        text = case.text
        inside = {j for m in _ATOM_ORACLE.finditer(text) for j in range(m.start() + 1, m.end())}
        now = [0.0]
        seg = StreamSegmenter(granularity=granularity, clock=partial(now.__getitem__, 0))
        ends = []
        for ch in text:
            ends += [s.end for s in seg.feed(ch)]
            now[0] += 10.0
            ends += [s.end for s in seg.poll(now[0])]
        ends += [s.end for s in seg.flush()]
        cuts += len(ends) - 1
        splits += sum(1 for e in ends if e in inside)
    return {"atom_splits_stalled": splits, "cuts_stalled": cuts}


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


SLICE = 4096


def feed_cost(granularity: str, text: str, chop: int | None) -> dict[str, float]:
    """Seconds to feed `text` (one delta, or slices of `chop` characters) and flush; the longest call."""
    from segmentation import StreamSegmenter

    seg = StreamSegmenter(granularity=granularity)
    deltas = [text] if chop is None else [text[i : i + chop] for i in range(0, len(text), chop)]
    total = longest = 0.0
    for d in deltas:
        t0 = time.perf_counter()
        seg.feed(d)
        dt = time.perf_counter() - t0
        total, longest = total + dt, max(longest, dt)
    t0 = time.perf_counter()
    seg.flush()
    dt = time.perf_counter() - t0
    return {"seconds": total + dt, "longest_call_s": max(longest, dt)}


def _feed_sized(texts: dict[int, str], granularity: str, chop: int | None, kib: int) -> dict[str, float]:
    return feed_cost(granularity, texts[kib], chop)


def normalize_cost(text: str, language: str) -> dict[str, Any]:
    from segmentation import normalize_for_speech

    t0 = time.perf_counter()
    try:
        normalize_for_speech(text, language)
    except Exception as e:  # a crash is a result too: the gateway would have lost the segment
        return {"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {str(e)[:80]}"}
    return {"seconds": time.perf_counter() - t0}


def _sized(sizes: list[int], measure: Callable[[int], dict[str, float]], budget_s: float) -> dict[str, Any]:
    """Time each size in turn (smallest first); skip the larger ones once one has taken `budget_s`."""
    out: dict[str, Any] = {}
    spent = 0.0
    for kib in sizes:
        if spent > budget_s:
            out[f"{kib}KiB"] = None  # the smaller size already took too long: quadratic, or worse
            continue
        r = measure(kib)
        spent = r["seconds"]
        out[f"{kib}KiB"] = {**r, "us_per_kib": r["seconds"] * 1e6 / kib}
    small, big = out[f"{sizes[0]}KiB"], out[f"{sizes[-1]}KiB"]
    out["ratio"] = big["seconds"] / small["seconds"] if small and big and small["seconds"] > 0 else None
    return out


def _cells(r: dict[str, Any], sizes: list[int]) -> str:
    return " ".join(f"{_f(r[f'{k}KiB'] and r[f'{k}KiB']['us_per_kib']):>12}" for k in sizes)


def hostile(
    sizes: list[int], norm_sizes: list[int], budget_s: float, shapes: set[str] | None, parts: set[str]
) -> dict[str, Any]:
    from segmentation import GRANULARITIES

    results: dict[str, Any] = {"sizes_kib": sizes, "slice_chars": SLICE, "segmenter": {}, "normalizer": {}}
    columns = " ".join(f"{f'µs/KiB@{k}K':>12}" for k in sizes)
    header = f"{'shape':24} {'mode':8} {'chop':5} {columns} {'ratio':>7} {'longest call ms':>15}"
    print(header + "\n" + "-" * len(header))
    for name, make in SEGMENTER_SHAPES.items() if "segmenter" in parts else ():
        if shapes and name not in shapes:
            continue
        texts = {kib: make(kib * 1024) for kib in sizes}
        for granularity in GRANULARITIES:
            for chop_name, chop in (("one", None), ("4KiB", SLICE)):
                r = _sized(sizes, partial(_feed_sized, texts, granularity, chop), budget_s)
                results["segmenter"][f"{name}/{granularity}/{chop_name}"] = r
                last = r[f"{sizes[-1]}KiB"] or r[f"{sizes[0]}KiB"]
                print(
                    f"{name:24} {granularity:8} {chop_name:5} {_cells(r, sizes)} {_f(r['ratio']):>7} "
                    f"{last['longest_call_s'] * 1e3:15.2f}"
                )
    columns = " ".join(f"{f'µs/KiB@{k}K':>12}" for k in norm_sizes)
    header = f"{'normaliser shape':24} {'lang':4} {columns} {'ratio':>7}"
    print("\n" + header + "\n" + "-" * len(header))
    for name, make in NORMALIZER_SHAPES.items() if "normalizer" in parts else ():
        if shapes and name not in shapes:
            continue
        for lang in ("en", "zh"):
            r = _sized(norm_sizes, lambda kib, lang=lang, make=make: normalize_cost(make(kib * 1024), lang), budget_s)
            results["normalizer"][f"{name}/{lang}"] = r
            errors = {e for k in norm_sizes if (c := r[f"{k}KiB"]) and (e := c.get("error"))}
            print(f"{name:24} {lang:4} {_cells(r, norm_sizes)} {_f(r['ratio']):>7} {' '.join(errors)}")
    rows = [(k, r) for part in ("segmenter", "normalizer") for k, r in results[part].items()]
    results["worst_ratio"] = max((r["ratio"] for _, r in rows if r["ratio"] is not None), default=None)
    results["skipped_as_too_slow"] = [k for k, r in rows if r["ratio"] is None]
    print(
        f"\nworst size ratio {_f(results['worst_ratio'])} (linear: ~{sizes[-1] // sizes[0]}); "
        f"too slow to finish: {results['skipped_as_too_slow']}"
    )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="default bench/out/segmentation[_hostile].json")
    ap.add_argument("--smoke", action="store_true", help="fewer repeats (CI)")
    ap.add_argument("--hostile", action="store_true", help="the hostile-input tables instead (see above)")
    ap.add_argument("--sizes", default="128,1024", help="--hostile: segmenter input sizes, KiB")
    ap.add_argument("--norm-sizes", default="8,64", help="--hostile: normaliser input sizes, KiB")
    ap.add_argument("--budget-s", type=float, default=5.0, help="--hostile: skip bigger sizes past this")
    ap.add_argument("--shapes", default="", help="--hostile: only these shapes (comma-separated)")
    ap.add_argument("--parts", default="segmenter,normalizer", help="--hostile: which tables")
    ap.add_argument("--baseline", default=None, help="a checkout's dir holding segmentation/ to compare with")
    ap.add_argument("--code", default=None, help="import segmentation from this dir (the baseline's run)")
    args = ap.parse_args()
    warm_up()
    if args.hostile:
        results = hostile(
            [int(k) for k in args.sizes.split(",")],
            [int(k) for k in args.norm_sizes.split(",")],
            args.budget_s,
            set(args.shapes.split(",")) - {""} or None,
            set(args.parts.split(",")),
        )
        path = Path(args.json or REPO / "bench" / "out" / "segmentation_hostile.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
        return
    args.json = args.json or str(REPO / "bench" / "out" / "segmentation.json")
    baseline = _run_baseline(args) if args.baseline else None
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
        if name.startswith("voxgate/"):
            results["segmenters"][name]["atoms"] = atom_splits(name, cases)
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
    if baseline is not None:
        results["baseline"] = {"code": str(Path(args.baseline).resolve()), **baseline}
        _print_before_after(baseline, results)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


def _run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The same measures on the baseline's segmentation package, in a subprocess (one import each)."""
    out = Path(args.json).with_suffix(".baseline.json")
    cmd = [sys.executable, __file__, "--code", args.baseline, "--json", str(out)] + (["--smoke"] * args.smoke)
    print(f"baseline: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _print_before_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    """voxgate's rows, the baseline's beside this checkout's: lag, cost, atom splits under stalls."""
    header = (
        f"\n{'voxgate (all)':18} {'run':6} {'false':>5} {'missed':>6} {'lag ch mean':>11} {'max':>4} "
        f"{'lag Δ mean':>10} {'p95':>4} {'µs p50':>7} {'µs p99':>7} {'MB/s':>7} {'atom splits':>11} {'/cuts':>6}"
    )
    print(header + "\n" + "-" * (len(header) - 1))
    for name in ("voxgate/sentence", "voxgate/clause", "voxgate/auto"):
        for label, r in (("before", before["segmenters"][name]), ("after", after["segmenters"][name])):
            q, s, a = r["quality"]["all"], r["speed"], r.get("atoms", {})
            print(
                f"{name:18} {label:6} {q['false_splits']:5d} {q['missed_sentence_ends']:6d} "
                f"{_f(q['lag_chars_mean']):>11} {q['lag_chars_max'] or 0:4d} {_f(q['lag_deltas_mean']):>10} "
                f"{_f(q['lag_deltas_p95']):>4} {s['cost_us_p50']:7.2f} {s['cost_us_p99']:7.2f} "
                f"{s['throughput_mb_s']:7.2f} {a.get('atom_splits_stalled', '-'):>11} {a.get('cuts_stalled', '-'):>6}"
            )


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
