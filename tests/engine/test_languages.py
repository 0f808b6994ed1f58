"""Language names made canonical once for every engine (engine/languages.py), and "auto" read from text."""

from __future__ import annotations

import pytest

from engine.languages import canonical_language, text_language
from engine.options import stream_request


@pytest.mark.parametrize(("given", "canonical"), [
    ("English", "en"), (" en-US ", "en"), ("en_gb", "en"), ("eng", "en"), ("Chinese", "zh"), ("Mandarin", "zh"),
    ("zh-CN", "zh"), ("zh_Hans", "zh"), ("zh-Hans-CN", "zh"), ("cmn", "zh"), ("Auto", "auto"), ("", "auto"),
    ("German", "de"), ("de-AT", "de"), ("fr", "fr"),
    ("Klingon", "klingon"), ("x" * 300, "x" * 300),  # not ours to judge: the engine refuses it
])  # fmt: skip
def test_every_spelling_of_a_language_is_one_name(given: str, canonical: str) -> None:
    assert canonical_language(given) == canonical


@pytest.mark.parametrize(("text", "lang"), [
    ("Hello there.", "en"), ("你好。", "zh"), ("我用iPhone打电话。", "zh"), ("Call 好吗", "zh"), ("3.14", "en"),
])  # fmt: skip
def test_any_han_means_mandarin(text: str, lang: str) -> None:
    assert text_language(text) == lang


def test_a_stream_request_carries_the_canonical_name() -> None:
    assert stream_request(None, "English", {}).language == "en"
    assert stream_request(None, "zh-CN", {}).language == "zh"
    assert stream_request(None, None, {}).language == stream_request(None, " Auto ", {}).language == "auto"


def test_a_session_config_reads_its_language_by_the_canonical_name() -> None:
    from gateway.protocol import SessionConfig  # the segmenter, normaliser and admission read this

    assert SessionConfig(language="en-US").language_code == "en" and SessionConfig().language_code == "auto"
