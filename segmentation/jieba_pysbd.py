"""The two outside judges the segmenter asks, each loaded on first use: jieba (word boundaries inside a
run of Han text) and pysbd (whether an ambiguous abbreviation ends an English sentence).

pysbd costs ~0.5 ms a call, so the segmenter asks it only at ambiguous abbreviations, within a budget
(`SegmentPolicy.pysbd_every`); jieba sees only bounded runs. `warm_up` loads both before the first
utterance needs them.
"""

from __future__ import annotations

import logging
from typing import Any

_pysbd_segmenter: Any = None
_jieba_ready = False


def pysbd_splits(text: str, at: int) -> bool:
    """Does pysbd end a sentence at `at` in `text`?"""
    global _pysbd_segmenter
    if _pysbd_segmenter is None:
        import pysbd

        _pysbd_segmenter = pysbd.Segmenter(language="en", clean=False, char_span=False)
    first = _pysbd_segmenter.segment(text)[0]
    return len(first) <= at


def jieba_cuts(run: str) -> list[int]:
    """Word boundaries (offsets) inside a run of Han text."""
    global _jieba_ready
    import jieba

    if not _jieba_ready:
        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()
        _jieba_ready = True
    return [end for _, _, end in jieba.tokenize(run)]


def warm_up() -> None:
    """Load jieba's dictionary and pysbd's rules now, not in the first utterance (~0.5 s)."""
    jieba_cuts("初始化")
    pysbd_splits("Warm up. Now", 9)
