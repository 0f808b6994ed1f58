"""The bounds every attack test holds its canary session to (bench/attack.py `run`): generous, since the
machine is a shared 2-core one, and the failures they guard against were 6–52 s stalls."""

from __future__ import annotations

from attack import Result

WAIT_S = 5.0  # the canary's worst wait for the server within an utterance (1–2 s here; 20–35 s before)
HEALTH_S = 2.5  # the worst /health latency (≤ 0.3 s here, 1.5 s on a box at load 15; 3–35 s before)


def assert_undisturbed(r: Result, rss_mb: float = 150.0) -> None:
    print(r)  # the numbers, for the record (pytest -s)
    c = r.canary
    assert c.failure is None and not c.errors, c
    assert c.worst_wait_s < WAIT_S, c
    assert r.health_worst_s < HEALTH_S, r
    assert set(r.health_statuses) == {"ok"}, r.health_statuses
    assert r.rss_growth_mb < rss_mb, r
