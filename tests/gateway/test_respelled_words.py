"""Timestamps in the words the client sent (issue 39): when a lexicon respells a word, the engine times
the respelling ("AWS" → "a w s"), and `audio.words` still reports the client's own words, each once, with
their characters in the text sent. Pure matching with a fake engine's timings, then a real Piper gateway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import call, open_session

from engine import Engine
from engine.words import words
from gateway.settings import Limits
from gateway.words import UtteranceWords
from segmentation.lexicon import Pronunciations

LEXICON = {"AWS": "a w s", "voxgate": "vocks gate", "New York": "noo york", "k8s": "kubernetes"}


def _timed(spoken: str, step: int = 100) -> list[tuple[str, float, float]]:
    """The engine's words of `spoken`, each `step` ms long, back to back."""
    return [(w, i * step, (i + 1) * step) for i, w in enumerate(spoken.split())]


def _spans(text: str, spoken: str, offset: int = 0) -> list[tuple[str, int, int, str]]:
    utt = UtteranceWords()
    utt.committed(0, text, offset, Pronunciations(LEXICON))
    out = utt.timed(0, text, _timed(spoken)) + utt.close_before(None)
    source = " " * offset + text
    for w in out:
        assert source[w.char_start : w.char_end] == w.word, w  # the characters of the word the client sent
    return [(w.word, w.start_ms, w.end_ms, source[w.char_start : w.char_end]) for w in out]


def test_a_respelling_whose_letters_are_words_of_the_text_keeps_them_apart() -> None:
    # "a" of "a w s" is also the text's own "a": it must not be taken for it (nor "is" and "AWS" skipped).
    got = _spans("AWS is a service.", "a w s is a service")
    assert [(w, s, e) for w, s, e, _ in got] == [("AWS", 0, 300), ("is", 300, 400), ("a", 400, 500),
                                                 ("service", 500, 600)]  # fmt: skip


def test_a_respelled_word_spans_its_respelling_and_the_next_word_follows() -> None:
    got = _spans("Try voxgate today.", "try vocks gate today", offset=12)
    assert [(w, s, e) for w, s, e, _ in got] == [("Try", 0, 100), ("voxgate", 100, 300), ("today", 300, 400)]


def test_a_respelled_phrase_shares_its_words_among_the_words_it_replaced() -> None:
    got = _spans("Off to New York now.", "off to noo york now")
    assert [(w, s, e) for w, s, e, _ in got] == [("Off", 0, 100), ("to", 100, 200), ("New", 200, 300),
                                                 ("York", 300, 400), ("now", 400, 500)]  # fmt: skip


def test_a_respelling_then_a_rewritten_number_each_keep_their_own_words() -> None:
    got = _spans("Run k8s for $5 now.", "run kubernetes for five dollars now")
    assert [(w, s, e) for w, s, e, _ in got] == [("Run", 0, 100), ("k8s", 100, 200), ("for", 200, 300),
                                                 ("5", 300, 500), ("now", 500, 600)]  # fmt: skip


def test_a_respelling_the_engine_said_otherwise_is_still_one_word() -> None:
    # The engine normalised the respelling differently ("vocks" → "vox"): the word absorbs what it said.
    got = _spans("Try voxgate today.", "try vox gate today")
    assert [(w, s, e) for w, s, e, _ in got] == [("Try", 0, 100), ("voxgate", 100, 300), ("today", 300, 400)]


@pytest.fixture(scope="module")
def gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=5.0))


TEXT = "I run AWS and voxgate in New York. It is a good service."


async def test_audio_words_report_the_words_sent_not_the_respelling(gateway: str) -> None:
    assert call(gateway, "PUT", "/v1/lexicons/brand", None, {"entries": LEXICON})[0] in (200, 201)
    ws, _ = await open_session(gateway, lexicon="brand", word_timestamps=True)
    got: list[dict[str, Any]] = []
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        while True:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                continue
            ev = json.loads(m)
            assert ev["type"] != "error", ev
            if ev["type"] == "audio.words":
                assert ev["estimated"] is False  # Piper's own durations, of the respelled text
                got += ev["words"]
            if ev["type"] == "session.done":
                break
    assert [w["word"] for w in got] == words(TEXT)  # the client's words, each once, in order
    assert all(TEXT[w["char_start"] : w["char_end"]] == w["word"] for w in got), got
    by_word = {w["word"]: w for w in got}
    # Spelled out letter by letter, "AWS" is a long word, and "a" (the text's own) is a short one later.
    assert by_word["AWS"]["end_ms"] - by_word["AWS"]["start_ms"] >= 400, by_word["AWS"]
    a = by_word["a"]
    assert a["start_ms"] > by_word["voxgate"]["end_ms"] and a["end_ms"] - a["start_ms"] < 400, a
    starts = [w["start_ms"] for w in got]
    assert starts == sorted(starts) and all(w["end_ms"] > w["start_ms"] for w in got), got
