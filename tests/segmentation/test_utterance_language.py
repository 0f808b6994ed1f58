"""UtteranceLanguage: a segment's reading language comes from its utterance (issue 38 item 3)."""

from __future__ import annotations

from segmentation import UtteranceLanguage, normalize_for_speech


def read(segments: list[str], language: str = "auto") -> list[str]:
    reading = UtteranceLanguage()
    return [normalize_for_speech(s, reading.of(s, language)) for s in segments]


def test_a_segment_with_no_letters_inherits_the_utterance_language() -> None:
    assert read(["完成率：", "12.5%。"]) == ["完成率：", "百分之十二点五。"]
    assert read(["要点：\n", "- 12.5%"]) == ["要点：", "百分之十二点五"]
    assert read(["The rate:\n", "- 12.5%"]) == ["The rate:", "twelve point five percent"]


def test_a_segment_with_letters_is_read_by_its_own_script() -> None:
    assert read(["我们发布了新版本。", "It costs $5 now."]) == ["我们发布了新版本。", "It costs five dollars now."]


def test_the_utterance_language_is_its_running_majority() -> None:
    reading = UtteranceLanguage()
    reading.of("OK, ")
    reading.of("我们的系统会自动根据您的使用习惯推荐，")
    assert reading.of("12.5%") == "zh"


def test_nothing_seen_yet_is_auto_and_a_named_language_is_kept() -> None:
    assert UtteranceLanguage().of("12.5%") == "auto"
    reading = UtteranceLanguage()
    reading.of("完成率：", "en")
    assert reading.of("12.5%", "en") == "en"
