"""Tenant lexicons (pronunciations) in the session store, so every replica speaks them the same.

A lexicon is a named map word → what to say instead: a respelling (a string), or an entry object with
IPA phonemes for the espeak-based voices and/or a respelling (`{"ipa": …, "say": …}`), stored whole as one
JSON value under the tenant's hash tag, with the tenant's index of names beside it; both are written by
one script, so the per-tenant bound holds against concurrent writers. Sizes are bounded here (entries,
word, respelling and IPA lengths) as well as at the HTTP edge, since the store is the one place every writer passes.
"""

from __future__ import annotations

import asyncio
import logging
import unicodedata
from typing import Annotated

import msgspec

from . import keys
from .errors import SessionStoreError
from .store import SessionStore

MAX_LEXICONS_PER_TENANT = 32
MAX_ENTRIES = 1000
MAX_WORD_CHARS = 64
MAX_SAY_CHARS = 128
MAX_IPA_CHARS = 128

log = logging.getLogger("voxgate")

Word = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_WORD_CHARS)]
Say = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SAY_CHARS)]
# One word's phonemes: no whitespace (a word is one phoneme token, which keeps its timing exact).
Ipa = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_IPA_CHARS, pattern=r"^\S+$")]


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An entry beyond a plain respelling: `ipa` for the voices that take phonemes (Piper, Kokoro), `say`
    for every other engine (and as the IPA's fallback). At least one of them."""

    ipa: Ipa | None = None
    say: Say | None = None

    def __post_init__(self) -> None:
        if self.ipa is None and self.say is None:
            raise ValueError("an entry needs ipa or say")


Entries = Annotated[dict[Word, Say | Entry], msgspec.Meta(max_length=MAX_ENTRIES)]


class Lexicon(msgspec.Struct, frozen=True):
    entries: Entries

    def respellings(self) -> dict[str, str]:
        """word → respelling, for every entry that has one."""
        return {w: e if isinstance(e, str) else e.say for w, e in self.entries.items()
                if isinstance(e, str) or e.say is not None}  # fmt: skip

    def phonemes(self) -> dict[str, str]:
        """word → IPA, for every entry that has phonemes."""
        return {w: e.ipa for w, e in self.entries.items() if isinstance(e, Entry) and e.ipa is not None}


class LexiconLimitExceeded(SessionStoreError):
    code = "lexicon_limit"


class InvalidLexiconEntry(SessionStoreError):
    code = "invalid_lexicon_entry"


# What an entry's word may hold besides letters, digits and marks: punctuation and symbols ("C++",
# "AT&T", "Node.js", "O'Brien", "rock-n-roll") and single spaces between words ("voxgate pro").
_SYMBOL_CATEGORIES = ("P", "S")


def word_problem(word: str) -> str | None:
    """Why `word` cannot be an entry's word, or None. A word is what the matcher (segmentation/lexicon.py)
    can find as whole tokens: letters and digits (any script, Han and kana included), with punctuation or
    symbols beside them and single spaces between words; at least one letter or digit (an entry of marks
    alone, "." or "~~~", would rewrite punctuation, not say a word); no control, format or unassigned
    characters, no whitespace at either end or other than single spaces."""
    if word.isalnum():  # the common case, at C speed
        return None
    if not any(c.isalnum() for c in word):
        return "an entry's word needs a letter or digit"
    if word != word.strip() or "  " in word:
        return "an entry's word may hold single spaces between its words only"
    for c in word:
        if c == " " or c.isalnum():
            continue
        category = unicodedata.category(c)
        if category[0] not in (*_SYMBOL_CATEGORIES, "M"):
            return f"an entry's word may not hold {unicodedata.name(c, f'U+{ord(c):04X}')}"
    return None


def first_invalid(lexicon: Lexicon) -> tuple[str, str] | None:
    """The first entry whose word is refused, and why."""
    return next(((w, p) for w in lexicon.entries if (p := word_problem(w)) is not None), None)


def _valid_only(lexicon: Lexicon, where: str) -> Lexicon:
    """A stored lexicon without the entries a PUT now refuses (put before the rule): skipped with a
    warning rather than failing every session that names it."""
    bad = [w for w in lexicon.entries if word_problem(w) is not None]
    if not bad:
        return lexicon
    log.warning("lexicon %s: %d stored entries are no longer valid words and are skipped (first %r)",
                where, len(bad), bad[0][:64])  # fmt: skip
    skipped = set(bad)
    return Lexicon({w: e for w, e in lexicon.entries.items() if w not in skipped})


# KEYS: the lexicon, the tenant's index; ARGV: name, bound, value. -1: the tenant holds `bound` others.
_PUT = """
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 and redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[2]) then
  return -1
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""
_DELETE = """
redis.call('SREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""


def _tenant(tenant: str) -> str:
    # The tenant's hash tag as sessions/keys.py writes it, so a lexicon sits in its tenant's cluster slot.
    return f"{keys.PREFIX}:{{{keys.check_id('tenant', tenant)}}}"


def lexicon_key(tenant: str, name: str) -> str:
    return f"{_tenant(tenant)}:lexicon:{keys.check_id('lexicon', name)}"


def lexicon_index(tenant: str) -> str:
    return f"{_tenant(tenant)}:lexicons"


_decoder = msgspec.json.Decoder(Lexicon)


class LexiconStore:
    def __init__(self, store: SessionStore, max_per_tenant: int = MAX_LEXICONS_PER_TENANT) -> None:
        self.store = store
        self.max_per_tenant = max_per_tenant
        self._put = store.client.register_script(_PUT)
        self._delete = store.client.register_script(_DELETE)

    async def put(self, tenant: str, name: str, lexicon: Lexicon) -> None:
        """Store (or replace) a lexicon; LexiconLimitExceeded past the tenant's bound; the bounds of
        `Lexicon` are checked again here (ValidationError), and its words (InvalidLexiconEntry), whoever
        the writer."""
        if (bad := first_invalid(lexicon)) is not None:
            raise InvalidLexiconEntry(f"entries.{bad[0][:64]}: {bad[1]}")
        value = msgspec.json.encode(msgspec.convert(msgspec.to_builtins(lexicon), Lexicon))
        keys_ = [lexicon_key(tenant, name), lexicon_index(tenant)]
        if await self.store.breaker.call(self._put(keys=keys_, args=[name, self.max_per_tenant, value])) == -1:
            raise LexiconLimitExceeded(f"tenant holds {self.max_per_tenant} lexicons already (delete one first)")

    async def get(self, tenant: str, name: str) -> Lexicon | None:
        raw = await self.store.breaker.call(self.store.client.get(lexicon_key(tenant, name)))
        if raw is None:
            return None
        # Checking 1000 long words takes ~30 ms: off the event loop.
        return await asyncio.to_thread(_valid_only, _decoder.decode(raw), f"{tenant}/{name}")

    async def names(self, tenant: str) -> list[str]:
        names = await self.store.breaker.call(self.store.client.smembers(lexicon_index(tenant)))
        return sorted(n.decode() if isinstance(n, bytes) else n for n in names)

    async def delete(self, tenant: str, name: str) -> bool:
        keys_ = [lexicon_key(tenant, name), lexicon_index(tenant)]
        return int(await self.store.breaker.call(self._delete(keys=keys_, args=[name]))) > 0
