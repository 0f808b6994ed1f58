"""What a misbehaving server (or a man in the middle) can make `voxgate_client` hold is bounded
(voxgate_client.session.Limits): one message's size, each speech's inbox in bytes, and what no speech
claims (audio no utterance owns is dropped). A real hostile WebSocket server in a process of its own
(tests/clients/hostile_server.py); the client's resident memory is read while it sends.

`pytest -s tests/clients/test_client_bounds.py` prints the growth per attack."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.servers import free_port

import voxgate_client
from voxgate_client import Limits, Session

MIB = 2**20
SERVER = Path(__file__).with_name("hostile_server.py")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"listening"
        yield f"ws://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


async def peak_growth(session: Session, seconds: float = 3.0, until: Callable[[], bool] | None = None) -> int:
    """The client's largest resident growth, in bytes, over `seconds` or until the socket closes; with
    `until`, as long as it takes the attack to arrive (a loaded machine delivers 300 MiB slowly), at most 60 s."""
    base = peak = rss()
    deadline = time.monotonic() + (60.0 if until else seconds)
    while time.monotonic() < deadline and session.closed is None and not (until and until()):
        await asyncio.sleep(0.05)
        peak = max(peak, rss())
    return peak - base


async def test_a_message_past_max_frame_bytes_closes_the_socket_unread(hostile: str) -> None:
    session = await voxgate_client.connect(f"{hostile}/huge")
    grew = await peak_growth(session, 5.0)
    closed = await asyncio.wait_for(session.wait_closed(), 10)
    print(f"\nthree 64 MiB messages: client grew {grew / MIB:.0f} MiB, closed {closed.close_code}")
    assert closed.close_code == 1009, closed  # message too big
    assert grew < 40 * MIB, grew / MIB


async def test_a_larger_max_frame_bytes_is_a_setting(hostile: str) -> None:
    session = await voxgate_client.connect(f"{hostile}/huge", limits=Limits(max_frame_bytes=65 * MIB))
    try:
        await asyncio.sleep(1.0)
        assert session.closed is None  # taken: file-mode users raise it for long files
    finally:
        await session.abort()


async def test_audio_no_utterance_owns_is_dropped(hostile: str) -> None:
    session = await voxgate_client.connect(f"{hostile}/stray-audio")
    try:
        grew = await peak_growth(session, until=lambda: session.dropped >= 300)
        print(f"\n300 MiB of audio no utterance owns: client grew {grew / MIB:.0f} MiB, dropped {session.dropped}")
        assert session.dropped == 300 and not session._unclaimed, session.dropped
        assert grew < 60 * MIB, grew / MIB
    finally:
        await session.abort()


async def test_unclaimed_events_are_bounded_in_bytes(hostile: str) -> None:
    session = await voxgate_client.connect(f"{hostile}/stray-events")
    try:
        grew = await peak_growth(session, until=lambda: session.dropped >= 299)
        print(f"\n300 unclaimed 1 MiB events: client grew {grew / MIB:.0f} MiB, dropped {session.dropped}")
        assert session._unclaimed_bytes <= Limits().unclaimed_bytes, session._unclaimed_bytes
        assert session.dropped >= 299, session.dropped
        assert grew < 60 * MIB, grew / MIB
    finally:
        await session.abort()


async def test_a_speech_not_read_holds_at_most_its_inbox_bytes(hostile: str) -> None:
    session = await voxgate_client.connect(f"{hostile}/unread-audio")
    try:
        speech = await session.say("Nobody reads this.")
        grew = await peak_growth(session)
        held = speech._inbox.bytes
        print(f"\n300 MiB to a speech nobody reads: client grew {grew / MIB:.0f} MiB, its inbox {held / MIB:.0f} MiB")
        assert held <= Limits().inbox_bytes + MIB, held / MIB
        assert grew < 120 * MIB, grew / MIB
        first = await asyncio.wait_for(anext(speech), 5)  # what it holds is still its audio, in order
        assert isinstance(first, voxgate_client.AudioStart | voxgate_client.Audio), first
    finally:
        await session.abort()
