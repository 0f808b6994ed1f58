"""Hardening round two (docs/research defect review 2026-12, findings 3, 4, 8, 10, 14): every way to make
work or hold memory is bounded. Each attack runs against a real server on loopback with a canary session
speaking beside it (bench/attack.py), whose worst wait, the server's /health latency and its memory growth
are asserted as in test_hardening.py (the server runs in this process: its RSS includes the test client).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from attack import Result, run
from support.servers import serve

from engine import Engine
from gateway.connection import Limits

pytestmark = pytest.mark.slow

WAIT_S = 5.0  # the canary's worst wait within an utterance (as test_hardening.py)
HEALTH_S = 1.5  # the worst /health latency


@pytest.fixture(scope="module")
def bounded(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(utterance_idle_timeout=1.5))


def assert_undisturbed(r: Result, rss_mb: float) -> None:
    print(r)  # the numbers, for the record (pytest -s)
    c = r.canary
    assert c.failure is None and not c.errors, c
    assert c.worst_wait_s < WAIT_S, c
    assert r.health_worst_s < HEALTH_S, r
    assert set(r.health_statuses) == {"ok"}, r.health_statuses
    assert r.rss_growth_mb < rss_mb, r


async def test_a_flood_of_bare_input_done_is_bounded_by_max_open_utterances(bounded: str) -> None:
    # Before: each bare input.done made an utterance past the bound (20 000 queued: +150 MB here, /health
    # 2.9 s). Now each is answered, in order, by session.done or too_many_utterances. The first run of a
    # process raises its high-water mark once (the canary, the allocator); the second must not grow it.
    bound = Limits().max_open_utterances
    for attempt in range(2):
        r = await run(bounded, "bare_done_flood", messages=20000)
        assert r.seen.get("error:too_many_utterances", 0) > 0, r.seen
        assert r.seen["cancelled"] <= bound + 1, r.seen  # what was queued: never more than the bound
        answered = r.seen["error:too_many_utterances"] + r.seen.get("session.done", 0) + r.seen["cancelled"]
        assert answered >= r.seen["sent"], r.seen  # every input.done answered (the long one's ack among them)
        assert_undisturbed(r, rss_mb=200.0 if attempt == 0 else 30.0)
