"""The canary's measures on a scripted socket whose answers are known by construction: what it waited for
the server (`worst_wait_s`) and what its listener heard (`worst_gap_s`, `underrun_s`) differ where the
server rightly sends a piece only when the listener is about to run dry."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from canary import Canary

RATE = 24000


def pcm(seconds: float) -> bytes:
    return b"\0\0" * int(RATE * seconds)


class Scripted:
    """A socket that answers each utterance with `(delay_s, message)` pairs, in order."""

    def __init__(self, utterances: list[list[tuple[float, Any]]]) -> None:
        self.utterances = deque(utterances)
        self.pending: deque[tuple[float, Any]] = deque()

    async def send(self, text: str) -> None:
        if json.loads(text)["type"] == "input.done":
            self.pending.extend(self.utterances.popleft())

    async def recv(self) -> Any:
        delay, message = self.pending.popleft()
        await asyncio.sleep(delay)
        return message


def event(type_: str) -> str:
    return json.dumps({"type": type_})


async def hear(utterances: list[list[tuple[float, Any]]]) -> Canary:
    canary = Canary("http://127.0.0.1:1")
    canary.rate, canary._ws = RATE, Scripted(utterances)
    for _ in utterances:
        await canary._utterance()
    return canary


async def test_a_piece_sent_late_but_before_the_listener_runs_dry_is_a_wait_and_no_gap() -> None:
    # 1 s of audio, then its rest 0.6 s later: the server waited, the listener never ran dry.
    canary = await hear([[(0.0, event("segment.committed")), (0.05, pcm(1.0)), (0.6, pcm(1.0)),
                          (0.0, event("session.done"))]])  # fmt: skip
    report = canary.report()
    assert 0.55 <= report.worst_wait_s < 1.0  # a busy box's event loop only adds to the scripted delays
    assert report.worst_gap_s < 0.3 and report.underrun_s == 0.0


async def test_a_piece_sent_after_the_listener_ran_dry_is_a_gap_of_that_long() -> None:
    canary = await hear([[(0.05, pcm(0.3)), (0.8, pcm(0.5)), (0.0, event("session.done"))]])
    report = canary.report()
    assert 0.45 <= report.worst_gap_s < 0.9 and 0.45 <= report.underrun_s < 0.9


async def test_an_utterances_first_audio_counts_from_when_the_one_before_has_played() -> None:
    # The second utterance's first audio comes 0.7 s after it was asked, 0.5 s after the first one's
    # 0.2 s had played: a gap of 0.5 s (a committed event in between does not shorten it).
    canary = await hear([
        [(0.0, pcm(0.2)), (0.0, event("session.done"))],
        [(0.0, event("segment.committed")), (0.7, pcm(0.2)), (0.0, event("session.done"))],
    ])  # fmt: skip
    assert 0.45 <= canary.report().worst_gap_s < 0.9
