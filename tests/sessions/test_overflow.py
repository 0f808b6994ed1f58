"""Replicas hand overflow to each other: two real `voxgate serve --model synthetic` replicas of capacity C
(`max_sessions`), one real Redis, behind deploy/haproxy.cfg and deploy/nginx.conf as shipped, offered
1.5 C sessions at once: C − 1 long ones on replica A that the balancer did not place (left by earlier
traffic, or by another balancer: it cannot know of them), and C / 2 + 1 clients through the balancer,
each opening short sessions one after another. A is then full whenever one of them sits there, and the
balancer, which does not know it, keeps sending it handshakes.

A full replica refuses the WebSocket before its upgrade (HTTP 503 `replica_full`, gateway/handshake.py);
the balancer retries it on the other, which has room (1.5 C < 2 C), so every session is served and the
client never sees a refusal. The replicas' logs show the refusals did happen (the test would prove
nothing otherwise)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from support.replicas import TwoReplicas
from support.wsclient import open_session

from ..conftest import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]
C = 4  # each replica's max_sessions
OFFERED = C * 3 // 2  # sessions open at once
HELD = C - 1  # of them, long ones on replica A
PER_CLIENT = 12  # sessions each of the OFFERED clients opens, one after another


class Pair(TwoReplicas):
    """Two synthetic replicas of C seats behind HAProxy and nginx."""

    def __init__(self, redis: RedisServer, logdir: Path) -> None:
        config = logdir / "voxgate.toml"
        config.write_text(f"max_sessions = {C}\n[engine_options]\nspeed = 8.0\nfirst_audio_s = 0.02\n")
        super().__init__(redis.url, logdir, "--config", str(config), model="synthetic", timeout=60)

    def refusals(self) -> int:
        """Handshakes the replicas refused so far (uvicorn logs each)."""
        return sum(r.log.read_text().count("rejected (503") for r in self.replicas)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    logdir = Path(tmp_path_factory.mktemp("overflow"))
    redis = RedisServer(logdir)
    redis.start()
    try:
        p = Pair(redis, logdir)
        try:
            yield p
        finally:
            p.stop()
    finally:
        redis.stop()


async def client(addr: str, rng: random.Random, outcomes: list[str]) -> None:
    """PER_CLIENT sessions, one after another: each speaks a short utterance, stays a while, closes."""
    for _ in range(PER_CLIENT):
        try:
            ws, ready = await open_session(addr, voice="synthetic")
        except websockets.InvalidStatus as e:
            outcomes.append(f"refused {e.response.status_code} {bytes(e.response.body or b'')[:120]!r}")
            await asyncio.sleep(0.05)
            continue
        try:
            if ready["type"] != "session.ready":
                outcomes.append(f"error {ready}")
                continue
            await ws.send(json.dumps({"type": "input.text", "text": "Overflow goes elsewhere."}))
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                m = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(m, str) and json.loads(m)["type"] in ("session.done", "error"):
                    break
            outcomes.append("served" if json.loads(m)["type"] == "session.done" else f"error {m}")
            await asyncio.sleep(rng.uniform(0.0, 0.6))  # uneven lengths: occupancy drifts from the rotation
        finally:
            await ws.close()


@pytest.mark.parametrize("balancer", ["haproxy", "nginx"])
async def test_one_and_a_half_capacity_is_served_by_two_replicas(pair: Pair, balancer: str) -> None:
    lb = pair.balancers[balancer]
    held = [await open_session(pair.replicas[0].addr, voice="synthetic") for _ in range(HELD)]
    assert all(ready["type"] == "session.ready" for _, ready in held), held
    before = pair.refusals()
    outcomes: list[str] = []
    t0 = time.monotonic()
    try:
        await asyncio.gather(*(client(lb.addr, random.Random(i), outcomes) for i in range(OFFERED - HELD)))
    finally:
        for ws, _ in held:
            await ws.close()
    took = time.monotonic() - t0
    overflowed = pair.refusals() - before
    served = outcomes.count("served")
    print(f"\n{balancer}: {served}/{len(outcomes)} sessions served in {took:.1f} s at {OFFERED} offered "
          f"(2 replicas × {C}, {HELD} held on A); {overflowed} handshakes refused by a full replica, "
          "retried on the other")
    assert len(outcomes) == (OFFERED - HELD) * PER_CLIENT
    # At most 1.5 C open at once, 2 C seats: a replica always had room, so no client is refused at all
    # (the goal's ≥ 99 % served is met with none lost).
    assert served == len(outcomes), [o for o in outcomes if o != "served"][:5]
    assert overflowed > 0, "no handshake met a full replica: the test exercised no overflow"
