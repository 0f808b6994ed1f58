from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A copy of ../shared/corpus/segmentation_cases.jsonl, so a checkout without shared/ tests the same.
SHARED_CORPUS = REPO / "tests" / "data" / "segmentation_cases.jsonl"
OWN_CASES = REPO / "tests" / "segmentation" / "cases.jsonl"


@dataclass(frozen=True)
class Case:
    id: str
    lang: str
    text: str
    sentences: list[str]


def load_cases() -> list[Case]:
    cases = []
    for path in (SHARED_CORPUS, OWN_CASES):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                d = json.loads(line)
                cases.append(Case(f"{path.stem}:{d['id']}", d["lang"], d["text"], d["sentences"]))
    return cases


def char_deltas(text: str, rng: random.Random, lo: int = 1, hi: int = 6) -> Iterator[str]:
    i = 0
    while i < len(text):
        k = rng.randint(lo, hi)
        yield text[i : i + k]
        i += k


def word_deltas(text: str) -> Iterator[str]:
    """Whole-word tokens the way an LLM streams English ("Hello", " world", "."), Han one by one."""
    yield from (m.group(0) for m in re.finditer(r"\s*(?:[A-Za-z0-9']+|.)", text, re.S))


CLAUSE_MARKS = ",;:，、；：—"


def sentence_ends(case: Case) -> set[int]:
    """The offsets where the case's sentences end (the last one's end excluded)."""
    ends, pos = set(), 0
    for sentence in case.sentences[:-1]:
        pos += len(sentence)
        ends.add(pos)
    return ends


def clause_ends(text: str) -> set[int]:
    """Where a clause commit may end: after a clause mark, its closers and whitespace."""
    from segmentation.chars import CLOSERS

    out = set()
    for i, c in enumerate(text):
        if c in CLAUSE_MARKS:
            j = i + 1
            while j < len(text) and (text[j] in CLOSERS or text[j] == "—"):
                j += 1
            while j < len(text) and text[j].isspace():
                j += 1
            out.add(j)
    return out


def mandarin_deltas(text: str, seed: int) -> list[str]:
    """`text` in deltas of 1 or 2 characters (a Mandarin LLM token), chosen by `seed`."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, 2)
        out.append(text[i : i + k])
        i += k
    return out
