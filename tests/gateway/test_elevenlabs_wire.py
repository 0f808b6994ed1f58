"""ElevenLabs' wire (gateway/protocols/elevenlabs.py) alone: native events in, the provider's messages out,
no socket and no engine."""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway.protocol import AudioStart, AudioWords, SegmentCommitted, WordTime
from gateway.protocols.elevenlabs import ElevenLabsWire, OutputFormat

PCM_16K = OutputFormat("pcm_16000", "pcm", 16000)
MS = 32  # bytes of 16 kHz s16le audio a millisecond


async def test_interleaved_frames_go_out_tagged_with_their_context_each_on_its_own_clock() -> None:
    """Multi-stream-input: two contexts' utterances playing at once, their frames arriving interleaved, each
    frame named by its utterance: every audio message carries its own context's id and alignment."""
    sent: list[dict[str, Any]] = []

    async def send(text: str) -> None:
        sent.append(json.loads(text))

    wire = ElevenLabsWire(send, PCM_16K, multi=True, stop=lambda: None, max_contexts=5)
    for index, (cid, word) in enumerate([("a", "Alpha"), ("b", "Bravo")]):
        wire.inbound(json.dumps({"text": f"{word}. ", "context_id": cid, "flush": True}))
        await wire.outbound("", SegmentCommitted(index, 0, f"{word}.", 0, len(word) + 1, "sentence", context_id=cid))
        words = [WordTime(f"{word}.", 0, 100, 0, 0, len(word) + 1)]  # within the first 200 ms
        await wire.outbound("", AudioWords(index, words, estimated=False, context_id=cid))
        await wire.outbound("", AudioStart(utterance_index=index, sample_rate=16000, format="pcm", context_id=cid))
    for utterance in (1, 0, 1, 0):  # b's frame first: b's audio does not wait for a's
        await wire.audio(bytes([utterance + 1]) * 200 * MS, utterance)
    audio = [m for m in sent if m.get("audio")]
    assert [m["contextId"] for m in audio] == ["b", "a", "b", "a"]
    for m in audio:  # the frame is the one its context's utterance sent
        assert set(base64.b64decode(m["audio"])) == {1 if m["contextId"] == "a" else 2}
    for cid, word in (("a", "Alpha."), ("b", "Bravo.")):
        mine = [m for m in audio if m["contextId"] == cid]
        assert "".join(mine[0]["alignment"]["chars"]) == word  # the word starts in its context's first message
        assert mine[0]["normalizedAlignment"]["charStartTimesMs"][0] == 0  # on its own clock, from 0
        assert mine[1]["alignment"]["chars"] == [""]  # the second 200 ms starts no character


async def test_a_frame_of_an_utterance_not_playing_is_dropped() -> None:
    """A frame named by an utterance the wire knows nothing of (its audio.start never came, or it was
    cancelled) goes nowhere: it cannot be told to any context."""
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    wire = ElevenLabsWire(send, PCM_16K, multi=True, stop=lambda: None, max_contexts=5)
    await wire.audio(b"\0" * MS, 7)
    assert sent == []
