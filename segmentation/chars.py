"""Character classes shared by the segmenter and the normaliser."""

from __future__ import annotations

import re

HAN_SENTENCE_ENDS = frozenset("。！？")
LATIN_SENTENCE_ENDS = frozenset("!?")
ELLIPSIS = "…"
# Closing quotes and brackets stay with the sentence (or clause) they close.
CLOSERS = frozenset("\"'”’」』）)]】》〉")
HAN_CLAUSE_MARKS = frozenset("，、；：")
LATIN_CLAUSE_MARKS = frozenset(",;:")
DASH = "—"

# Han ideographs (CJK Unified + Extension A + compatibility). Han punctuation is not Han text. The engine
# has the same class (engine/languages.py HAN): the segmenter and the engine import nothing of each other.
HAN_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # the ranges of is_han, for character classes
HAN_RE = re.compile(f"[{HAN_CLASS}]")
LATIN_WORD_RE = re.compile(r"[A-Za-z0-9\u00c0-\u024f]+(?:['’][A-Za-z]+)?")


def is_han(c: str) -> bool:
    o = ord(c)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF


def is_latin_alnum(c: str) -> bool:
    return (c.isascii() and c.isalnum()) or "\u00c0" <= c <= "\u024f"


def check_text(text: object) -> str:
    """Reject what no speech stack can carry: non-strings and lone UTF-16 surrogates."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, not {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"text holds an invalid UTF-16 surrogate at index {e.start}; send whole code points"
            ) from None
    return text
