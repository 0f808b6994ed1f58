"""Issue 13, finding 4 through a real gateway: two clients with `split_granularity: "none"` each send
64 KiB of prose as one segment while a canary session speaks beside them. Each 64 KiB segment was one
pool job that held a CPU-voice worker for minutes: the canary waited 41 s (19.8 s in a 20 s attack).
Now segments run in bounded pieces and the canary's short utterance gets the next free worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from attack import run
from support.servers import serve


@pytest.fixture
def gateway(piper_engine: Any) -> Iterator[str]:
    for addr in serve(piper_engine):
        yield f"http://{addr}"


async def test_two_none_mode_huge_segments_leave_the_canary_speaking(gateway: str) -> None:
    result = await run(gateway, "none_mode_huge_segments", hold_s=8.0)
    canary, why = result.canary, repr(result)[:600]
    assert canary.failure is None and not canary.errors, why
    assert result.seen["audio_bytes"] > 0, "the long utterances must speak too"
    assert canary.utterances >= 3, why
    assert canary.worst_wait_s < 3.0, f"the canary waited {canary.worst_wait_s:.1f} s for a worker: {why}"
    assert result.health_worst_s < 1.0, why
    # Bounded work per stream: the arena of two runs and a piece of look-ahead audio, not the
    # synthesised hours the attack would otherwise queue (+216 MB in 20 s before).
    assert result.rss_growth_mb < 150, why
