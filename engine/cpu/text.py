"""Text handling the CPU voices need: per-segment language, sentence pieces, Han/Latin runs."""

from __future__ import annotations

import re

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_RE = re.compile(f"[{_HAN}]")
_RUNS = re.compile(f"([{_HAN}][{_HAN}\\s，。！？、；：“”‘’（）《》…—·0-9０-９%％]*)|([^{_HAN}]+)")
# A sentence ends at . ! ? … (ASCII ones only before a space or the end, so "3.14" stays whole) or
# at the Han marks, which need no space after them.
_SENTENCE = re.compile(r".+?(?:[.!?…]+[\"')\]”’]*(?=\s|$)|[。！？]+[”’」』）]*|$)", re.S)

LANGUAGE_ALIASES: dict[str, str] = {
    "auto": "auto",
    "en": "en", "en-us": "en", "en_us": "en", "en-gb": "en", "eng": "en", "english": "en",
    "zh": "zh", "zh-cn": "zh", "zh_cn": "zh", "zh-hans": "zh", "cmn": "zh", "chinese": "zh",
    "mandarin": "zh",
}


def canonical_language(language: str | None) -> str | None:
    """"English", "en-US", "Chinese", "zh-CN", "Auto"… → "en" / "zh" / "auto"; None when unknown."""
    if language is None or not language.strip():
        return "auto"
    return LANGUAGE_ALIASES.get(language.strip().lower())


def detect_language(text: str) -> str:
    """"zh" when the segment holds any Han character, else "en".

    Any Han decides it because the Mandarin voices read embedded Latin words too (through English
    phonemes), while the English voice cannot read Han at all.
    """
    return "zh" if _HAN_RE.search(text) else "en"


def strip_han(text: str) -> str:
    return _HAN_RE.sub(" ", text)


def han_latin_runs(text: str) -> list[tuple[bool, str]]:
    """Split mixed text into (is_han, run) pieces, in order, dropping nothing but empty runs."""
    out: list[tuple[bool, str]] = []
    for han, other in _RUNS.findall(text):
        if han:
            out.append((True, han))
        elif other:
            out.append((False, other))
    return out


def sentences(text: str) -> list[str]:
    """Cut a segment into sentences (the unit of one model run); whitespace-only pieces dropped."""
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def split_long(phonemes: str, limit: int) -> list[str]:
    """Cut a phoneme string longer than `limit` symbols, preferring clause marks, then spaces."""
    out: list[str] = []
    rest = phonemes.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind(m) for m in ",;:.!?")
        if cut < limit // 3:
            cut = window.rfind(" ")
        if cut < limit // 3:
            cut = limit - 1
        out.append(rest[: cut + 1].strip())
        rest = rest[cut + 1 :].strip()
    if rest:
        out.append(rest)
    return out


def estimate_seconds(text: str) -> float:
    """Rough spoken length, for scheduling only: about 4.5 Han syllables or 3 English words a second."""
    han = len(_HAN_RE.findall(text))
    words = len(strip_han(text).split())
    return han / 4.5 + words / 3.0
