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


def _one_id_per_char(piece: str) -> tuple[list[int], list[tuple[int, int] | None]]:
    return list(range(len(piece))), [(j, j + 1) for j in range(len(piece))]


def test_a_word_starts_at_the_space_before_it() -> None:
    """The voices give the space between two words its own ids, and the next word's sound begins in
    them: a forced aligner (bench/word_timing.py) put Piper's starts 51 ms late on average while they
    began at the word's first phoneme. So a word's span takes in the whitespace before it, and the
    previous word ends where it begins. Not after a mark: a comma's pause, and the space after it, stay
    nobody's (with that space "how" of "calling, how" started up to 100 ms early)."""
    ph = "ab cd, ef"
    (unit,) = plan(ph, [["one"], ["two"], ["three"]], [ph], _one_id_per_char)
    assert unit.words == [("one", 0, 2), ("two", 2, 5), ("three", 7, 9)]


def test_a_piece_that_begins_after_the_space_keeps_its_first_word_inside_it() -> None:
    """A run cut at the space: the whitespace before the run's first word is in the previous run, and the
    word starts at its first id of this run (a word never starts in a run it is not in)."""
    ph = "ab cd"
    first, second = plan(ph, [["one"], ["two"]], ["ab ", "cd"], _one_id_per_char)
    assert first.words == [("one", 0, 2)] and second.words == [("two", 0, 2)]


def test_the_first_word_starts_where_the_run_first_sounds() -> None:
    """`heard_from` earlier than the first word's ids moves its start there (never later, never others)."""
    ph = "ab cd"
    (unit,) = plan(ph, [["one"], ["two"]], [ph], _one_id_per_char)
    assert place(unit, [10.0] * 5, lead=50.0, heard_from=20) == [("one", 20, 70), ("two", 70, 100)]
    assert place(unit, [10.0] * 5, lead=50.0, heard_from=60) == [("one", 50, 70), ("two", 70, 100)]


def test_two_words_espeak_reads_as_one_token_share_it_and_the_others_keep_theirs() -> None:
    """"for a" is one espeak token (`fɚɹə`): the two share it, and the words around keep their own tokens
    (spread in proportion, "day" began 1.5 ids early and "one" ran 0.75 of a token into "for")."""
    ph = "wʌn fɚɹə dˈeɪ"
    (unit,) = plan(ph, [["one"], ["for"], ["a"], ["day"]], [ph], _one_id_per_char)
    spans = {w: (s, e) for w, s, e in place(unit, [10.0] * len(ph))}
    assert spans["one"] == (0, 30)  # its token, wʌn
    assert spans["for"][0] == 30 and spans["for"][1] == spans["a"][0] and spans["a"][1] == 80  # fɚɹə's, shared
    assert spans["day"] == (80, 130)  # from the space before dˈeɪ
