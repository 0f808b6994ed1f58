"""The gateway's CPU for sessions that are open and silent (between turns): `voxgate serve --model
synthetic` on real Redis (bench/capacity.py's Server), N sessions connected and configured, the server's
CPU over a window. What each open session costs a replica while nobody speaks.

    python bench/idle_cpu.py [--sessions 256] [--seconds 10] [--ref GIT_REF]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import capacity


async def measure(server: capacity.Server, n: int, seconds: float) -> float:
    """CPU seconds the server spent over `seconds` with `n` silent sessions open."""
    url = f"ws://{server.addr}/v1/audio/speech/stream"
    opened = await asyncio.gather(*(capacity.open_session(url, 30) for _ in range(n)))
    try:
        await asyncio.sleep(2)  # the sessions' start-up work has settled
        cpu0 = server.cpu_s()
        await asyncio.sleep(seconds)
        return server.cpu_s() - cpu0
    finally:
        await asyncio.gather(*(ws.close() for ws, _ in opened if ws is not None), return_exceptions=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--ref", help="serve this git ref's tree (git archive) instead of this one")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-") as tmp:
        redis = capacity.Redis(Path(tmp))
        src = capacity.source_tree(args.ref, Path(tmp)) if args.ref else capacity.REPO
        server = capacity.Server(src, redis.url, Path(tmp), capacity.parse_args([])).wait_healthy()
        try:
            t0 = time.monotonic()
            empty = asyncio.run(measure(server, 0, args.seconds))
            held = asyncio.run(measure(server, args.sessions, args.seconds))
            per = 1000 * (held - empty) / args.seconds / args.sessions
            print(f"{args.ref or 'this tree'}: {args.sessions} silent sessions: {held:.2f} s CPU over "
                  f"{args.seconds:g} s (no sessions: {empty:.2f} s): {per:.3f} ms per session-second "
                  f"({time.monotonic() - t0:.0f} s run)")  # fmt: skip
        finally:
            server.stop()
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
