"""The server events as types: the documented tables agree with the Structs, every event encodes from
its Struct, and a cancel is answered even when there is nothing to cancel."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.wsclient import open_session, utterance

from gateway import protocol

ROOT = Path(__file__).resolve().parents[2]
EVENTS: dict[str, type[msgspec.Struct]] = {t.__struct_config__.tag: t for t in typing.get_args(protocol.Event)}


def event_table(markdown: str, heading: str) -> dict[str, list[str]]:
    """{type: [field, …]} of the first `| type | fields |` table after `heading`; a field written
    `name?` is kept with its `?`."""
    rows: dict[str, list[str]] = {}
    lines = markdown[markdown.index(heading) :].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("| type"))
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        kind, fields = (cell.strip() for cell in line.strip("|").split("|")[:2])
        if m := re.fullmatch(r"`([a-z._]+)`", kind):
            names = ",".join(re.findall(r"`([^`]*)`", fields))
            rows[m[1]] = [n.strip() for n in names.split(",") if n.strip()]
    return rows


def struct_fields(kind: type[msgspec.Struct]) -> list[str]:
    """Its fields, `?` marking one that is left out unless set (an UNSET default)."""
    return [f.name + ("?" if f.default is msgspec.UNSET else "") for f in msgspec.structs.fields(kind)]


def test_docs_event_table_is_the_types() -> None:
    table = event_table((ROOT / "docs" / "protocol.md").read_text(), "## Server events")
    assert table.keys() == EVENTS.keys()
    for kind, fields in table.items():
        assert fields == struct_fields(EVENTS[kind]), kind


CLIENT_MESSAGES: dict[str, type[msgspec.Struct]] = {
    "session.config": protocol.SessionConfig, "input.text": protocol.InputText, "input.done": protocol.InputDone,
    "input.cancel": protocol.InputCancel, "session.close": protocol.SessionClose,
}  # fmt: skip


def test_docs_client_message_table_is_the_types() -> None:
    """docs/protocol.md is the contract: every message a client may send, with every field it takes."""
    table = event_table((ROOT / "docs" / "protocol.md").read_text(), "## Client messages")
    assert table.keys() == CLIENT_MESSAGES.keys() == set(protocol.KNOWN_TYPES)
    for kind, fields in table.items():
        assert fields == [f.name for f in msgspec.structs.fields(CLIENT_MESSAGES[kind])], kind


def test_every_event_encodes_from_its_struct_and_decodes_back() -> None:
    timing = protocol.Timing(0, None, None, None, 0, None, 0)
    samples: list[protocol.ServerEvent] = [
        protocol.SessionReady(session_id="s", sample_rate=24000, channels=1, format="pcm", voice=None,
                              language="en", split_granularity="auto", resumed=False, next_utterance_index=0),
        protocol.SegmentCommitted(utterance_index=0, segment_index=0, text="Hi.", start=0, end=3, reason="sentence"),
        protocol.AudioStart(utterance_index=0, sample_rate=24000, format="pcm"),
        protocol.AudioMark(utterance_index=0, segment_index=1, sample_offset=480),
        protocol.AudioWords(utterance_index=0, words=[protocol.WordTime("Hi", 0, 180, 0, 0, 2)], estimated=False),
        protocol.AudioChunkMessage(utterance_index=0, chunk_id=1, chunk_start_ms=0, chunk_end_ms=180, sample_rate=24000,
                                   audio_b64="", timestamps=[protocol.OmniWord("Hi", 0, 180)]),
        protocol.AudioWaiting(utterance_index=0, reason="queue", ahead=None),
        protocol.AudioDone(utterance_index=0, total_bytes=2, error=False, timing=timing),
        protocol.SessionDone(utterance_index=0, total_sentences=1, timing=timing),
        protocol.AudioCancelled(utterance_index=None, played_bytes=0, spoken_text="", cancelled=False),
        protocol.CodecStart(utterance_index=0, codebooks=16, codebook_size=2048, frame_rate_hz=12.5,
                            sample_rate=24000, decoder_id="d"),
        protocol.CodecDone(utterance_index=0, total_frames=3, seq_last=4, error=False, cancelled=True, spoken_text=""),
        protocol.Error(code="backlog_full", message="m", utterance_index=2, rejected_chars=5),
    ]  # fmt: skip
    assert {type(e) for e in samples} == set(EVENTS.values())
    for ev in samples:
        wire = json.loads(protocol.encode(ev))
        assert wire["type"] == ev.__struct_config__.tag
        unset = {f.rstrip("?") for f in struct_fields(type(ev)) if f.endswith("?")}
        assert all(k not in wire for k in unset if getattr(ev, k) is msgspec.UNSET)  # absent, never null
        assert msgspec.json.decode(protocol.encode(ev), type=protocol.Event) == ev


def test_codec_header_round_trips() -> None:
    flags = protocol.CodecFlag.RESET | protocol.CodecFlag.SEGMENT_END
    header = protocol.pack_codec_header(7, 3, flags)
    assert len(header) == protocol.CODEC_HEADER.size == 7
    assert protocol.unpack_codec_header(header + b"\0" * 96) == (7, 3, flags)


def test_a_config_is_decoded_once_and_says_what_was_sent() -> None:
    msg = protocol.decode('{"type": "session.config", "voice": "joe", "speed": 1.0, "extra": 1}')
    assert protocol.sent_fields(msg) == {"voice": "joe", "speed": 1.0}
    cfg = protocol.config_of(msg)
    assert (cfg.voice, cfg.language, cfg.response_format, cfg.streamed) == ("joe", "auto", "pcm", True)


@pytest.mark.parametrize(
    ("fields", "streamed"),
    [({}, True), ({"response_format": "wav"}, False), ({"response_format": "pcm", "stream_audio": False}, False),
     ({"response_format": "ulaw"}, True), ({"response_format": "mp3", "stream_audio": True}, None)],
)  # fmt: skip
def test_a_file_format_without_stream_audio_means_files(fields: dict[str, Any], streamed: bool | None) -> None:
    cfg = protocol.config_of(protocol.decode(json.dumps({"type": "session.config", **fields})))
    if streamed is None:
        with pytest.raises(protocol.ProtocolError, match="streamed") as refused:
            cfg.validate()
        assert refused.value.code == "unsupported_format"
        return
    cfg.validate()
    assert cfg.streamed is streamed


async def next_event(ws: Any) -> dict[str, Any]:
    while isinstance(m := await asyncio.wait_for(ws.recv(), 10), bytes):
        pass
    return json.loads(m)


async def test_a_cancel_with_nothing_playing_is_answered(gateway: str) -> None:
    ws, ready = await open_session(gateway)
    assert ready["type"] == "session.ready"
    await ws.send(json.dumps({"type": "input.cancel"}))  # before any utterance
    assert await next_event(ws) == {"type": "audio.cancelled", "utterance_index": None, "played_bytes": 0,
                                    "spoken_text": "", "cancelled": False}  # fmt: skip
    events, binary = await utterance(ws, "Hello there. How are you?")
    done = next(e for e in events if e["type"] == "audio.done")
    await ws.send(json.dumps({"type": "input.cancel"}))  # right after the last audio was sent
    answer = await next_event(ws)
    assert answer == {"type": "audio.cancelled", "utterance_index": 0, "played_bytes": done["total_bytes"],
                      "spoken_text": "Hello there. How are you?", "cancelled": False}  # fmt: skip
    assert done["total_bytes"] == sum(map(len, binary)) > 0
    # A cancel that cuts an utterance still says so, and the session goes on.
    await ws.send(json.dumps({"type": "input.text", "text": "One more sentence to cut short. " * 20}))
    await ws.send(json.dumps({"type": "input.cancel"}))
    while (ev := await next_event(ws))["type"] != "audio.cancelled":
        pass
    assert ev["utterance_index"] == 1 and ev["cancelled"] is True
    await ws.close()


def test_loading_settings_does_not_import_the_websocket_machinery() -> None:
    code = "import sys, gateway.settings; print(' '.join(m for m in sys.modules if m.startswith('gateway')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert set(loaded.stdout.split()) == {"gateway", "gateway.settings"}, loaded.stdout
