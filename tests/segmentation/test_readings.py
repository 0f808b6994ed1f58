"""Mixed zh/en replies and how they must read (tests/data/readings_zh_en.jsonl), and that no pause or
packetization changes a reading (issue 38: audio has no undo).

Each reply is streamed through StreamSegmenter (auto) and each segment normalised in its utterance's
language (UtteranceLanguage), as the gateway does. Read in one delta it must give the corpus reading;
character by character with a stall (fake clock past the idle timeout) after every character, or in
random packets with random stalls, the same words (spacing between segments aside).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from segmentation import StreamSegmenter, UtteranceLanguage, normalize_for_speech

CORPUS = Path(__file__).resolve().parents[1] / "data" / "readings_zh_en.jsonl"
REPLIES = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def read(deltas: list[str], stalls: set[int]) -> list[str]:
    now = [0.0]
    seg = StreamSegmenter("auto", "auto", clock=lambda: now[0])
    out = []
    for n, d in enumerate(deltas):
        now[0] += 0.01
        out += seg.feed(d)
        if n in stalls:
            now[0] += 5.0
            out += seg.poll(now[0])
    out += seg.flush()
    reading = UtteranceLanguage()
    return [normalize_for_speech(s.text, reading.of(s.text)) for s in out]


def joined(spoken: list[str]) -> str:
    return " ".join(s for s in spoken if s)


def words(spoken: str) -> str:
    return "".join(spoken.split())


@pytest.mark.parametrize("reply", REPLIES, ids=[r["text"][:24] for r in REPLIES])
def test_each_reply_reads_as_the_corpus_says(reply: dict[str, str]) -> None:
    assert joined(read([reply["text"]], set())) == reply["spoken"]


@pytest.mark.parametrize("reply", REPLIES, ids=[r["text"][:24] for r in REPLIES])
def test_a_stall_after_every_character_changes_no_reading(reply: dict[str, str]) -> None:
    text = reply["text"]
    assert words(joined(read(list(text), set(range(len(text)))))) == words(reply["spoken"])


@pytest.mark.parametrize("reply", REPLIES, ids=[r["text"][:24] for r in REPLIES])
def test_random_packets_and_stalls_change_no_reading(reply: dict[str, str]) -> None:
    text = reply["text"]
    for seed in range(12):
        rng = random.Random(seed)
        deltas, i = [], 0
        while i < len(text):
            k = rng.randint(1, 4)
            deltas.append(text[i : i + k])
            i += k
        stalls = {n for n in range(len(deltas)) if rng.random() < 0.3}
        assert words(joined(read(deltas, stalls))) == words(reply["spoken"]), (seed, deltas, stalls)
