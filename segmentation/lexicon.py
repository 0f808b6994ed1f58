"""A tenant's pronunciations applied to committed text before normalisation: each entry's word, where it
stands as a whole word, is replaced by what to say instead (a respelling such as "vocks gate").

Case: an entry written in lower case matches the word in any case ("voxgate", "Voxgate", "VOXGATE"); one
with a capital in it matches only as written (so "US" can differ from "us"). Word boundaries: a word of
letters or digits matches only where no letter or digit touches it (so "gate" leaves "gateway" alone); a
word of Han characters (or other scripts written without spaces) matches wherever it stands, as such text
has no spaces between words. The longest entry wins where entries overlap.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

# Scripts written without spaces between words: no word boundary can be asked of them.
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def _pattern(word: str) -> str:
    body = re.escape(word)
    if not any(c.isupper() for c in word):
        body = f"(?i:{body})"
    # A boundary only on a side where the word itself is a letter or digit that is not of an unspaced script.
    first, last = word[0], word[-1]
    before = r"(?<![^\W_])" if _spaced_word_char(first) else ""
    after = r"(?![^\W_])" if _spaced_word_char(last) else ""
    return before + body + after


def _spaced_word_char(c: str) -> bool:
    return (c.isalnum() or unicodedata.category(c) == "Mn") and not _UNSPACED.match(c)


class Pronunciations:
    """A compiled lexicon: `apply(text)` is one regex pass over the text, whatever the number of entries."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = dict(entries)
        self._say = {w.casefold() if not any(c.isupper() for c in w) else w: s for w, s in self.entries.items()}
        words = sorted(self.entries, key=len, reverse=True)  # the longest first: the longest wins
        self._regex = re.compile("|".join(_pattern(w) for w in words)) if words else None

    def __bool__(self) -> bool:
        return bool(self.entries)

    def apply(self, text: str) -> str:
        if self._regex is None:
            return text
        return self._regex.sub(self._replace, text)

    def _replace(self, m: re.Match[str]) -> str:
        found = m.group(0)
        return self._say.get(found, self._say.get(found.casefold(), found))
