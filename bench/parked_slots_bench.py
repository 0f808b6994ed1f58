"""Idle open utterances against the Qwen engine's slots (issue 13, finding 2): a real gateway on loopback
over the tiny model with `--slots` KV slots; `--slots` sockets each say one sentence and leave the
utterance open (each parks a request in a slot) for `--hold` s while a canary session speaks; then a
probe session asks for a reply. Per run: the canary's worst wait, the probe's time to first audio,
/health's worst latency. Prints a table and writes JSON.

    python bench/parked_slots_bench.py [--runs 3] [--slots 32] [--hold 6] [--tree PATH] [--json OUT]

`--tree` runs another checkout's engine and gateway (e.g. `git archive <commit> | tar -x -C /tmp/old`)
with this checkout's attack and canary: the before/after of docs/engine.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def setup_path(tree: Path) -> None:
    sys.path[:0] = [str(tree), str(tree / "tests"), str(BENCH)]


async def one_run(slots: int, hold: float, canary_timeout: float) -> dict[str, Any]:
    from attack import ATTACKS, Context
    from canary import Canary, HealthProbe
    from support.servers import serve

    from engine import load_engine
    from gateway.connection import Limits

    engine = load_engine("tiny", cache_dir=tempfile.mkdtemp(), max_streams=slots, frames_per_token=2.0,
                         min_frames=6)
    # The gateway's own idle bound on open utterances (where it has one) is kept out of the way: this
    # measures the engine.
    fields = {f.name for f in dataclasses.fields(Limits)}
    limits = Limits(**({"utterance_idle_timeout": 600.0} if "utterance_idle_timeout" in fields else {}))
    server = serve(engine, limits)
    url = next(server)
    try:
        async with Canary(url, voice="ryan", timeout=canary_timeout) as canary, HealthProbe(url) as health:
            seen = await ATTACKS["parked_slots"](Context(url, None, {"voice": "ryan", "sockets": slots,
                                                                     "hold_s": hold}))
            await canary.keep_hearing(2)
        report = canary.report()
        return {"canary_worst_wait_s": report.worst_wait_s, "canary_failure": report.failure,
                "probe_first_audio_s": seen["probe_first_audio_s"], "sockets_heard": seen["sockets_heard"],
                "probe_told": [e for e in seen.get("probe_events", []) if e != "segment.committed"],
                "health_worst_s": health.worst_s}
    finally:
        next(server, None)
        engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--hold", type=float, default=6.0)
    p.add_argument("--canary-timeout", type=float, default=20.0, help="the canary gives up waiting after this")
    p.add_argument("--tree", type=Path, default=BENCH.parent, help="the checkout whose engine and gateway run")
    p.add_argument("--json", default=str(BENCH / "results" / "parked_slots.json"))
    args = p.parse_args(argv)
    setup_path(args.tree.resolve())
    rows = [asyncio.run(one_run(args.slots, args.hold, args.canary_timeout)) for _ in range(args.runs)]
    print(f"{'run':>3} {'canary worst wait':>17} {'probe first audio':>17} {'health worst':>12}  canary failure / told")
    for i, r in enumerate(rows):
        probe = "none" if r["probe_first_audio_s"] is None else f"{r['probe_first_audio_s']:.2f}s"
        print(f"{i:>3} {r['canary_worst_wait_s']:>16.2f}s {probe:>17} {r['health_worst_s']:>11.3f}s  "
              f"{r['canary_failure'] or '-'} / {','.join(r['probe_told']) or '-'}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"tree": str(args.tree), "slots": args.slots, "hold_s": args.hold, "runs": rows}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
