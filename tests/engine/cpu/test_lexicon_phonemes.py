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
@pytest.mark.parametrize(("voice", "language"), [("joe", "en"), ("jf_alpha", "zh")])
async def test_an_ipa_word_is_spoken_as_given_and_keeps_its_timing(cpu_engine: Any, collect: Any, voice: str,
                                                                   language: str) -> None:
    text = "Welcome to voxgate." if language == "en" else "欢迎使用voxgate。"
    backend = cpu_engine._piper if voice == "joe" else cpu_engine._kokoro
    args = () if voice == "joe" else (language,)
    pinned = backend.timed_units(text, *args, Pinned({"voxgate": "bˈɑks"}))
    plain = backend.timed_units(text, *args)
    assert [u.ids for u in pinned] != [u.ids for u in plain]  # other phonemes reach the model
    stream = cpu_engine.open_stream(voice, language, word_timings=True, phonemes={"voxgate": IPA})
    stream.append(text)
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
