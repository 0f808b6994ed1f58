"""The corpus, fed as an LLM would: the split points, the commit lag and the round trip."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from support.segcases import Case, char_deltas, clause_ends, load_cases, word_deltas
from support.segcases import sentence_ends as sentence_ends_of

from segmentation import Segment, StreamSegmenter
from segmentation.chars import is_han

CASES = load_cases()
def run(text: str, deltas: Iterable[str], granularity: str) -> list[tuple[Segment, int]]:
    """Feed the deltas; return each segment with how many characters had arrived at its commit."""
    # A still clock: the sentence and clause decisions alone (the first-piece cut needs time to pass,
    # tests/segmentation/test_first_word_cut.py).
    seg = StreamSegmenter(granularity=granularity, clock=lambda: 0.0)
    got: list[tuple[Segment, int]] = []
    received = 0
    for d in deltas:
        received += len(d)
        got += [(s, received) for s in seg.feed(d)]
    got += [(s, received) for s in seg.flush()]
    return got


def feeds(case: Case) -> list[tuple[str, list[str]]]:
    out = [("words", list(word_deltas(case.text)))]
    for seed in range(4):
        out.append((f"chars{seed}", list(char_deltas(case.text, random.Random(hash((case.id, seed)))))))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("granularity", ["sentence", "clause", "auto"])
def test_corpus_splits_lag_and_round_trip(case: Case, granularity: str) -> None:
    assert "".join(case.sentences) == case.text, "corpus case is inconsistent"
    sentence_ends = sentence_ends_of(case)
    allowed = set(sentence_ends)
    if granularity != "sentence":
        allowed |= clause_ends(case.text)
    for name, deltas in feeds(case):
        got = run(case.text, deltas, granularity)
        texts = [s.text for s, _ in got]
        assert "".join(texts) == case.text, name
        # A long Mandarin run's cut at a word (tests/segmentation/test_run_cut.py) is counted apart.
        words = [s for s, _ in got if s.reason == "word"]
        assert granularity != "sentence" or not words, name
        assert all(is_han(case.text[s.end - 1]) and is_han(case.text[s.end]) for s in words), name
        ends = [s.end for s, _ in got[:-1] if s.reason != "word"]
        false_splits = [e for e in ends if e not in allowed]
        assert not false_splits, f"{name}: false splits at {false_splits}: {texts}"
        missed = [b for b in sentence_ends if b not in ends]
        assert not missed, f"{name}: missed sentence ends at {missed}: {texts}"
        for s, received in got:
            assert s.text == case.text[s.start : s.end]
            if s.end in sentence_ends:
                # Committed no later than the delta that brought the next non-space character.
                arrival = 0
                for d in deltas:
                    arrival += len(d)
                    if arrival > s.end:
                        break
                assert received <= arrival, f"{name}: {s.text!r} committed late"
        if granularity == "sentence":
            assert texts == case.sentences, name


def test_corpus_is_present() -> None:
    assert len(CASES) >= 60
