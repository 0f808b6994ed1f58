"""A lexicon's IPA entries on the espeak-based voices (issue 18): the word is spoken with the phonemes given,
spliced into espeak's phonemes of the rest of its clause, and keeps its word timing; a symbol the voice
does not know is refused at check time (never dropped unheard)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.cpu.espeak import Espeak, Pinned
from engine.types import EngineError, StreamRequest, Words

IPA = "vˈɑksɡeɪt"


def test_pinned_words_are_spliced_into_the_clause_in_any_case_unless_capitalised() -> None:
    espeak = Espeak.shared()
    pinned = Pinned({"voxgate": IPA, "US": "jˌuːˈɛs"})
    got = espeak.phonemize("Welcome to Voxgate, the US gateway for us.", "en-us", pinned)
    plain = espeak.phonemize("the gateway for us.", "en-us")
    # Read in one piece around it: "to" keeps its weak form, as before any noun ("tə", not a clause's "tuː").
    assert got.startswith(f"wˈɛlkʌm tə {IPA}, ðə jˌuːˈɛs "), got
    assert got.endswith(plain.split("ðə ", 1)[1]), (got, plain)  # "us" is not "US": espeak reads it
    assert espeak.phonemize("VOXGATE!", "en-us", pinned) == IPA + "!"
    assert IPA not in espeak.phonemize("voxgates and voxgate's", "en-us", pinned)  # whole words only
    # A year is several tokens for one word: the clause is read around the pinned word instead.
    year = espeak.phonemize("In 1999 voxgate.", "en-us", pinned)
    assert year.endswith(f" {IPA}.") and year.startswith(espeak.phonemize("In 1999")), year


# Kokoro's English is the same espeak call as Piper's; its Mandarin reads Latin runs through espeak apart.
@pytest.mark.parametrize(("backend", "args", "text"), [("piper", (), "Welcome to voxgate."),
                                                       ("kokoro", ("zh",), "欢迎使用voxgate。")])
def test_an_ipa_word_is_given_its_ids_and_keeps_its_timing(cpu_engine: Any, backend: str, args: tuple[str, ...],
                                                           text: str) -> None:
    """The model is given the IPA's ids in the word's place, and the word's span (what its timing is read
    from, engine/cpu/timings.py) is those ids (and at most the space before them). (The gateway's IPA test
    times it end to end.)"""
    model = cpu_engine.model(backend)
    pinned = model.timed_units(text, *args, Pinned({"voxgate": "bˈɑks"}))
    assert [u.ids for u in pinned] != [u.ids for u in model.timed_units(text, *args)]
    [(unit, x0, x1)] = [(u, x0, x1) for u in pinned for w, x0, x1 in u.words if w == "voxgate"]
    ids, spans = model.ids_spans("bˈɑks")
    span, given = unit.ids[round(x0) : round(x1)], ids[spans[0][0] : spans[-1][1]]
    assert span[len(span) - len(given) :] == given and len(span) - len(given) <= 2, (unit, x0, x1)


async def test_a_stream_with_phonemes_times_the_word(cpu_engine: Any, collect: Any) -> None:
    stream = cpu_engine.open_stream("joe", "en", word_timings=True, phonemes={"voxgate": IPA})
    stream.append("Welcome to voxgate.")
    stream.finish()
    events, end = await collect(stream)
    assert end.reason == "done", end
    timed = {w.word: w for e in events if isinstance(e, Words) for w in e.words}
    assert "voxgate" in timed and timed["voxgate"].end > timed["voxgate"].start, timed


def test_ipa_the_voice_cannot_speak_is_refused_at_check(cpu_engine: Any) -> None:
    cpu_engine.check(StreamRequest(voice="joe", language="en", phonemes={"voxgate": IPA}))
    for voice, language in [("joe", "en"), (None, "auto"), ("jf_alpha", "zh")]:
        with pytest.raises(EngineError) as e:
            cpu_engine.check(StreamRequest(voice=voice, language=language, phonemes={"voxgate": "v☃ks"}))
        assert e.value.code == "unsupported_phonemes" and "☃" in str(e.value), e.value
