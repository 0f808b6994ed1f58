"""How long one full pass of the cyclic garbage collector stops a serving process (engine/heap.py).

    python bench/gc_pause.py --models piper,tiny --repeat 3 --json bench/out/gc_pause.json

Per model, in a fresh process of its own: the gateway's modules imported and the engine loaded as a
server has them, then `--repeat` full collections timed (`gc.collect()`, which holds the GIL and so
stops the event loop for as long), then `engine.heap.settle` as the gateway calls it before serving, and
`--repeat` full collections again. The same process and objects both times, so a shared box's load
falls on both alike; the table gives the tracked objects and the least and worst pass of each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(model: str, repeat: int) -> dict[str, Any]:
    """In this process: load `model`, time full passes before and after the heap is settled."""
    import gc

    import gateway.app  # noqa: F401  the gateway's imports, as a serving process holds them
    from engine import heap, load_engine

    engine = load_engine(model)

    def passes() -> list[float]:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            gc.collect()
            times.append(round((time.perf_counter() - t0) * 1000, 1))
        return times

    try:
        gc.collect()
        tracked, before = len(gc.get_objects()), passes()
        heap.settle(collect=True)
        return {"model": model, "tracked": tracked, "frozen": gc.get_freeze_count(),
                "before_ms": before, "after_ms": passes()}  # fmt: skip
    finally:
        engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="piper,tiny")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: measure this model, print its JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeat)))
        return
    rows = []
    for model in args.models.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", model, "--repeat", str(args.repeat)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'model':<8} {'tracked':>9} {'full pass before (min/max ms)':>31} {'after settle':>16}")
    for r in rows:
        b, a = r["before_ms"], r["after_ms"]
        print(f"{r['model']:<8} {r['tracked']:>9} {min(b):>15.1f} / {max(b):<13.1f} {min(a):>7.1f} / {max(a):<6.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
