"""A tenant's pronunciations applied to committed text before normalisation: each entry's word, where it
stands as a whole word, is replaced by what to say instead (a respelling such as "vocks gate").

Case: an entry written in lower case matches the word in any case ("voxgate", "Voxgate", "VOXGATE"); one
with a capital in it matches only as written (so "US" can differ from "us"). Word boundaries: a word of
letters or digits matches only where no letter or digit touches it (so "gate" leaves "gateway" alone); a
word of Han characters (or other scripts written without spaces) matches wherever it stands, as such text
has no spaces between words. The longest entry wins where entries overlap (the leftmost first).

Cost: the text is cut into tokens once (runs of letters and digits, single characters of the unspaced
scripts, runs of whitespace, single other characters) and entries are token sequences, so a match can
only begin and end where a letter/digit run does. One-token entries are a dict lookup per token; longer
ones (phrases, Han words, "C++") are found by an Aho–Corasick automaton run over the tokens backwards,
which gives the longest entry starting at each token. Applying a lexicon is linear in the text, whatever
the number or length of its entries.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence

# Scripts written without spaces between words: no word boundary can be asked of them.
_UNSPACED_CLASS = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_UNSPACED = re.compile(f"[{_UNSPACED_CLASS}]")
# A run of letters/digits of a spaced script; a run of whitespace; any other single character.
_TOKEN = re.compile(rf"[^\W_{_UNSPACED_CLASS}]+|\s+|.", re.S)
_SPACE = " "  # every whitespace run is one token: "voxgate pro" matches across a line break too


def tokens(text: str) -> list[str]:
    """`text` cut into the tokens entries are matched on (whitespace runs as one " ")."""
    return [_SPACE if t[0].isspace() else t for t in _TOKEN.findall(text)]


def _case_sensitive(word: str) -> bool:
    return any(c.isupper() for c in word)


class _Automaton:
    """Aho–Corasick over token sequences, built on the reversed entries: run over the reversed text it
    gives, at each token, the length (in tokens) of the longest entry that starts there."""

    def __init__(self, entries: Sequence[tuple[str, ...]]) -> None:
        self._symbol: dict[str, int] = {}
        for entry in entries:
            for t in entry:
                self._symbol.setdefault(t, len(self._symbol))
        self._n = len(self._symbol) or 1
        self._goto: dict[int, int] = {}  # node * n + symbol → node
        depth, terminal, children = [0], [False], [[]]  # children only while building
        for entry in entries:
            node = 0
            for t in reversed(entry):
                key = node * self._n + self._symbol[t]
                if (child := self._goto.get(key)) is None:
                    child = self._goto[key] = len(depth)
                    depth.append(depth[node] + 1)
                    terminal.append(False)
                    children.append([])
                    children[node].append((self._symbol[t], child))
                node = child
            terminal[node] = True
        self._fail = [0] * len(depth)
        self._best = [0] * len(depth)  # the longest entry among the node's suffixes, in tokens
        queue = deque(c for _, c in children[0])
        while queue:
            node = queue.popleft()
            self._best[node] = depth[node] if terminal[node] else self._best[self._fail[node]]
            for sym, child in children[node]:
                f = self._fail[node]
                while f and f * self._n + sym not in self._goto:
                    f = self._fail[f]
                target = self._goto.get(f * self._n + sym, 0)
                self._fail[child] = target if target != child else 0
                queue.append(child)

    def longest_from(self, keys: Sequence[str]) -> list[int]:
        """For each token of `keys`, the longest entry (in tokens) starting there; 0: none."""
        out = [0] * len(keys)
        goto, fail, best, symbol, n = self._goto, self._fail, self._best, self._symbol, self._n
        node = 0
        for i in range(len(keys) - 1, -1, -1):
            sym = symbol.get(keys[i])
            if sym is None:
                node = 0
                continue
            while node and node * n + sym not in goto:
                node = fail[node]
            node = goto.get(node * n + sym, 0)
            out[i] = best[node]
        return out


class _Side:
    """The entries of one case rule: those matched as written, or those matched casefolded."""

    def __init__(self, entries: Mapping[tuple[str, ...], str]) -> None:
        self.say = dict(entries)
        self.one = {k[0] for k in entries if len(k) == 1}
        longer = [k for k in entries if len(k) > 1]
        self.automaton = _Automaton(longer) if longer else None

    def longest(self, keys: list[str]) -> list[int] | None:
        """Per token, the longest entry starting there (None: no entry matches anywhere)."""
        lengths = self.automaton.longest_from(keys) if self.automaton is not None else None
        if self.one:
            hits = [i for i, k in enumerate(keys) if k in self.one]
            if hits:
                lengths = lengths or [0] * len(keys)
                for i in hits:
                    lengths[i] = max(lengths[i], 1)
        return lengths


class Pronunciations:
    """A compiled lexicon: `apply(text)` is linear in the text, whatever the number of entries."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = dict(entries)
        exact: dict[tuple[str, ...], str] = {}
        folded: dict[tuple[str, ...], str] = {}
        for word, say in self.entries.items():
            if not (key := tuple(tokens(word))):
                continue
            if _case_sensitive(word):
                exact[key] = say
            else:
                folded[tuple(t.casefold() for t in key)] = say
        self._exact = _Side(exact) if exact else None
        self._folded = _Side(folded) if folded else None

    def __bool__(self) -> bool:
        return bool(self.entries)

    def apply(self, text: str) -> str:
        if self._exact is None and self._folded is None:
            return text
        out: list[str] = []
        at = 0
        for start, end, say in self.respellings_in(text):
            out += [text[at:start], say]
            at = end
        out.append(text[at:])
        return "".join(out)

    def respellings_in(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, say): where `apply` replaces `text[start:end]` by `say`, in order. The gateway maps
        the engine's words of the respelled text back to the words the client wrote (gateway/words.py)."""
        if self._exact is None and self._folded is None:
            return []
        pieces = _TOKEN.findall(text)
        keys = [_SPACE if t[0].isspace() else t for t in pieces]
        exact = self._exact.longest(keys) if self._exact is not None else None
        folded_keys = [k.casefold() for k in keys] if self._folded is not None else keys
        folded = self._folded.longest(folded_keys) if self._folded is not None else None
        if exact is None and folded is None:
            return []
        found: list[tuple[int, int, str]] = []
        i = at = 0
        while i < len(pieces):
            lx = exact[i] if exact is not None else 0
            lf = folded[i] if folded is not None else 0
            if lx == lf == 0:
                at += len(pieces[i])
                i += 1
                continue
            if lx >= lf:  # as written wins a tie ("US" before "us")
                assert self._exact is not None
                say, n = self._exact.say[tuple(keys[i : i + lx])], lx
            else:
                assert self._folded is not None
                say, n = self._folded.say[tuple(folded_keys[i : i + lf])], lf
            end = at + sum(len(p) for p in pieces[i : i + n])
            found.append((at, end, say))
            i, at = i + n, end
        return found
