"""The README's event sketch is what a real session sends: the same events in the same order (a segment's
`audio.mark` before its audio), with the fields it shows, and a cancel with `played_ms` answered with
`heard_text`. A real gateway (Piper), a real websockets client driven by the sketch's own messages."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import websockets

ROOT = Path(__file__).resolve().parents[2]


def sketch() -> list[tuple[str, list[dict[str, Any] | str]]]:
    """The README's ```json sketch as (direction, [message or "binary", …]) per line."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    lines: list[tuple[str, list[dict[str, Any] | str]]] = []
    for line in block.splitlines():
        direction, rest = line[0], line[1:]
        items: list[dict[str, Any] | str] = []
        for m in re.finditer(r"\{[^{}]*\}|binary", rest):
            if m[0] == "binary":
                items.append("binary")
            else:  # "…" stands for fields left out, or for a value
                shown = re.sub(r",?\s*…(?=\s*\})", "", m[0]).replace('"…"', '""').replace(": …", ": 0")
                items.append(json.loads(shown))
        lines.append((direction, items))
    return lines


def collapse(kinds: list[str]) -> list[str]:
    """Runs of binary frames as one "binary"."""
    return [k for i, k in enumerate(kinds) if not (k == "binary" and i and kinds[i - 1] == "binary")]


def follows_in_order(sketched: list[list[str]], seen: list[str]) -> bool:
    """Each sketched line's events appear together, as a run, after the line before's. Commits are left
    out of the runs: they answer the text side and may come between any two audio events."""
    seen = [k for k in seen if k != "segment.committed"]
    at = 0
    for line in sketched:
        run = [k for k in line if k != "segment.committed"]
        found = next((i for i in range(at, len(seen) - len(run) + 1) if seen[i : i + len(run)] == run), None)
        if found is None:
            return False
        at = found + len(run)
    return True


async def test_the_readmes_event_sketch_is_a_real_session(gateway: str) -> None:
    lines = sketch()
    assert [d for d, _ in lines].count("→") >= 4 and all(d in "→←" for d, _ in lines)
    received: list[dict[str, Any] | str] = []
    reply = "help with that. Your order shipped yesterday and should arrive on Friday, before noon. " * 3

    async with websockets.connect(f"ws://{gateway}/v1/audio/speech/stream", max_size=None) as ws:

        async def read_until(stop: str) -> None:
            while True:
                m = await asyncio.wait_for(ws.recv(), 30)
                received.append("binary" if isinstance(m, bytes) else json.loads(m))
                if received[-1] == stop or (isinstance(received[-1], dict) and received[-1]["type"] == stop):
                    return

        replies = 0
        for direction, items in lines:
            for msg in items if direction == "→" else []:
                assert isinstance(msg, dict)
                await ws.send(json.dumps(msg))
                if msg["type"] == "session.config":
                    await read_until("session.ready")
                elif msg["type"] == "input.text":  # the sketch's first words, then the rest of a reply
                    await ws.send(json.dumps({"type": "input.text", "text": reply}))
                    replies += 1
                    if replies == 2:  # the reply the sketch barges in on: its audio is playing
                        await read_until("audio.mark")
                        await read_until("binary")
                elif msg["type"] == "input.done":
                    await read_until("session.done")
                elif msg["type"] == "input.cancel":
                    await read_until("audio.cancelled")
    kinds = collapse([m if isinstance(m, str) else m["type"] for m in received])
    shown = [[m if isinstance(m, str) else m["type"] for m in items] for d, items in lines if d == "←"]
    assert follows_in_order(shown, kinds), (shown, kinds)
    # Every mark precedes its audio: what follows a mark is its segment's first frame.
    for i, kind in enumerate(kinds[:-1]):
        if kind == "audio.mark":
            assert kinds[i + 1] == "binary", kinds[i : i + 3]
    # The fields the sketch shows are the events' own.
    events = {m["type"]: m for m in received if isinstance(m, dict)}
    for d, items in lines:
        for msg in items:
            if d == "←" and isinstance(msg, dict):
                assert set(msg) <= set(events[msg["type"]]), (msg, events[msg["type"]])
    cancelled = events["audio.cancelled"]
    assert cancelled["cancelled"] is True and cancelled["played_bytes"] > 0, cancelled
    heard, spoken = cancelled["heard_text"], cancelled["spoken_text"]
    assert heard and (spoken.startswith(heard) or heard.startswith(spoken)), cancelled
