"""Word timings from the CPU voices' duration predictors (engine/cpu/timings.py, durations.py): each
word of the text comes in a `Words` event before the audio that speaks it, in order, on the stream's
frame count, inside its audio; none without `word_timings`."""

from __future__ import annotations

from typing import Any

import pytest

from engine.cpu.timings import TimedUnit, place, plan
from engine.types import AudioChunk, Words
from engine.words import words

EN = ("joe", "en", ["Hello there, how are you today? ", "I want to buy a couple of apples."], None)
CASES = [EN, (*EN[:3], 16000), ("jf_gongitsune", "zh", ["好的，", "请打开voxgate的网页。"], None)]


async def _events(engine: Any, voice: str, lang: str, segments: list[str], collect: Any, **options: Any) -> list[Any]:
    stream = engine.open_stream(voice, lang, **options)
    for text in segments:
        stream.append(text)
    stream.finish()
    events, end = await collect(stream)
    assert end.reason == "done", end
    return events


@pytest.mark.parametrize(("voice", "lang", "segments", "rate"), CASES, ids=["piper-en", "piper-en-16k", "kokoro-zh"])
async def test_words_come_before_their_audio_in_order_inside_it(
    cpu_engine: Any, collect: Any, voice: str, lang: str, segments: list[str], rate: int | None
) -> None:
    options: dict[str, Any] = {"word_timings": True} | ({"sample_rate": rate} if rate else {})
    events = await _events(cpu_engine, voice, lang, segments, collect, **options)
    sent = 0  # frames of audio put before each event
    total = sum(e.pcm.size for e in events if isinstance(e, AudioChunk))
    for seg, text in enumerate(segments):
        timed = [(w, ev) for ev in events if isinstance(ev, Words) and ev.segment == seg for w in ev.words]
        assert [w.word for w, _ in timed] == words(text)  # every word, in order
    last = 0
    for ev in events:
        if isinstance(ev, AudioChunk):
            sent = ev.first_frame + ev.pcm.size
            continue
        assert isinstance(ev, Words) and ev.sample_rate == (rate or 24000)
        for w in ev.words:
            assert last <= w.start <= w.end <= total, (w, last, total)
            assert w.start >= sent, (w, sent)  # announced before any of its audio went out
            last = w.start


async def test_no_words_unless_asked(cpu_engine: Any, collect: Any) -> None:
    events = await _events(cpu_engine, "joe", "en", ["Hello there."], collect)
    assert events and not any(isinstance(e, Words) for e in events)


def test_a_word_espeak_reads_as_two_tokens_still_gets_a_span() -> None:
    """Counts that differ spread the words over the tokens in proportion: all placed, in order."""
    ph = "ab cd ef"  # three tokens for two words
    ids_of = lambda piece: (list(range(len(piece))), [(j, j + 1) for j in range(len(piece))])  # noqa: E731
    (unit,) = plan(ph, [["one"], ["two"]], [ph], ids_of)
    assert isinstance(unit, TimedUnit) and [w for w, _, _ in unit.words] == ["one", "two"]
    spans = place(unit, [10.0] * len(ph))
    assert spans[0][1] == 0 and spans[0][2] <= spans[1][1] and spans[1][2] == 80
