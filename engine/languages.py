"""Language names as clients send them, made canonical once for every engine; and the rule by which an
"auto" segment's text names its language.

Clients name languages every way: "en", "en-US", "English", "zh_CN", "Chinese", "Mandarin", "Auto"
(vLLM-Omni's clients). `stream_request` (engine/options.py) makes the name canonical before any engine
or admission sees it: admission's cost tables are keyed by ISO code (a name they do not know is priced
as the costliest voice), and no engine needs to know every spelling.
"""

from __future__ import annotations

import re

# A Han character (the CJK unified ideographs, extension A, the compatibility block), as a character
# class: the CPU voices cut and count text by it (engine/cpu/text.py).
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
HAN_RE = re.compile(f"[{HAN}]")
_TAG = re.compile(r"([a-z]{2,3})(?:[-_][a-z0-9]{1,8})+")  # a BCP 47 tag: its primary subtag names the language

# Language names and ISO 639-2/3 codes → ISO 639-1 (what the engines and admission's costs speak).
NAMES: dict[str, str] = {
    "english": "en", "eng": "en",
    "chinese": "zh", "mandarin": "zh", "zho": "zh", "chi": "zh", "cmn": "zh",
    "german": "de", "deu": "de", "ger": "de",
    "italian": "it", "ita": "it",
    "portuguese": "pt", "por": "pt",
    "spanish": "es", "spa": "es",
    "japanese": "ja", "jpn": "ja",
    "korean": "ko", "kor": "ko",
    "french": "fr", "fra": "fr", "fre": "fr",
    "russian": "ru", "rus": "ru",
}


def canonical_language(name: str) -> str:
    """"English", "en-US", "zh_CN", "zh-Hans", "Chinese", "Auto", "" → "en" / "zh" / "auto".

    A tag counts by its primary subtag (BCP 47: "de-AT" is German). Any other name comes back stripped
    and lower-cased, for the engine to judge (`unsupported_language`)."""
    lang = name.strip().lower()
    if not lang:
        return "auto"
    if tag := _TAG.fullmatch(lang):
        lang = tag.group(1)
    return NAMES.get(lang, lang)


def text_language(text: str) -> str:
    """The language an "auto" segment is spoken in: "zh" when it holds any Han character, else "en".

    Any Han decides it because the Mandarin voices read embedded Latin words too (through English
    phonemes), while the English voice cannot read Han at all. The CPU voices choose a segment's voice by
    it, and admission prices an "auto" stream by it (gateway/admission.py)."""
    return "zh" if HAN_RE.search(text) else "en"
