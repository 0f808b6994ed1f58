"""What a "word" is for word timings: a run of letters and digits (inner apostrophes and hyphens kept:
"don't", "twenty-four"), or one Han character (Mandarin writes no spaces; a character is a syllable).

The engines time these words in the text they speak and the gateway matches them to the text the
client sent (gateway/words.py), so both sides cut text the same way.
"""

from __future__ import annotations

import re

from engine.languages import HAN as _HAN

_LETTER = f"(?:(?![{_HAN}])[^\\W_])"
WORD = re.compile(f"[{_HAN}]|{_LETTER}+(?:['’\\-]{_LETTER}+)*")


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each word of `text`, in order."""
    return [m.span() for m in WORD.finditer(text)]


def words(text: str) -> list[str]:
    return WORD.findall(text)


def key(word: str) -> str:
    """What two spellings of one word share: case and apostrophe style aside."""
    return word.casefold().replace("’", "'")
