"""The attack suite: each attack of issue 13 against a live gateway, with a canary session speaking
beside it and `/health` probed throughout. Prints a table and writes JSON.

    python bench/attack.py --url http://127.0.0.1:8000 [--only NAME,…] [--key KEY] [--json OUT.json]

Every attack is an `async def (ctx) -> dict` registered with `@attack(name)`; it returns what it saw
(the codes it got back, say). `run(url, name)` runs one with the canary and the probe and returns a
`Result` (the tests assert on it; this script prints it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from canary import Canary, CanaryReport, HealthProbe, server_rss


@dataclass
class Context:
    url: str  # http://HOST:PORT
    key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # per-attack knobs (tests shrink them)


Attack = Callable[[Context], Awaitable[dict[str, Any]]]
ATTACKS: dict[str, Attack] = {}


def attack(name: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = fn
        return fn

    return register


@dataclass
class Result:
    name: str
    canary: CanaryReport
    health_worst_s: float
    health_statuses: dict[str, int]
    rss_growth_mb: float
    seconds: float
    seen: dict[str, Any]


async def run(url: str, name: str, *, key: str | None = None, after: int = 2, **options: Any) -> Result:
    """Run attack `name` with a canary speaking and /health probed; `after` canary utterances must
    complete after the attack returns (the canary keeps hearing speech)."""
    ctx = Context(url, key, options)
    t0 = time.monotonic()
    async with Canary(url, key=key) as canary, HealthProbe(url) as health:
        rss0 = await asyncio.to_thread(server_rss, url)
        seen = await ATTACKS[name](ctx)
        await canary.keep_hearing(after)
        rss1 = await asyncio.to_thread(server_rss, url)
    return Result(name, canary.report(), health.worst_s, dict(health.statuses), round((rss1 - rss0) / 2**20, 1),
                  round(time.monotonic() - t0, 2), seen)  # fmt: skip


# -- attacks (each section names its finding in issue 13) -------------------------------------------------

# -- more attacks above this line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--key", default=None, help="an API key, when the gateway has keys")
    p.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    p.add_argument("--json", default="bench/results/attack.json")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        p.error(f"unknown attacks {unknown}; known: {list(ATTACKS)}")
    results = [asyncio.run(run(args.url, n, key=args.key)) for n in names]
    print(f"{'attack':<28} {'canary worst wait':>17} {'underrun':>9} {'utts':>5} {'health worst':>12} "
          f"{'RSS +MB':>8} {'canary errors / failure'}")  # fmt: skip
    for r in results:
        c = r.canary
        problems = c.failure or ", ".join(e.get("code", "?") for e in c.errors) or "-"
        print(f"{r.name:<28} {c.worst_wait_s:>16.2f}s {c.underrun_s:>8.2f}s {c.utterances:>5} "
              f"{r.health_worst_s:>11.3f}s {r.rss_growth_mb:>8.1f} {problems}")  # fmt: skip
    with open(args.json, "w") as f:
        json.dump([asdict(r) for r in results], f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
