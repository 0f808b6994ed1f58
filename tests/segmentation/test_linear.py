"""feed() does work in proportion to what it is fed: every granularity, every hostile shape, any chop.

The segmenter runs on the gateway's event loop, so a shape that made it rescan its buffer at every
forced cut or every mark would stall every session. Work is counted, never timed: the lines run in
segmentation/, the characters each regular-expression call spans, and the characters handed to
jieba and pysbd. Eight times the text must cost at most about eight times the work; a rescan per cut
or per mark costs ~64 times. A small `max_chars` makes every shape cut many times at these sizes.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hostile_text import SEGMENTER_SHAPES

import segmentation
from segmentation import GRANULARITIES, Segment, StreamSegmenter, jieba_pysbd
from segmentation import chars as chars_module
from segmentation import segmenter as segmenter_module

SEGMENTATION_DIR = str(Path(segmentation.__file__).parent)
# A long Mandarin run is cut every few characters too (`run_cut_han`), well inside max_chars.
POLICY = {"max_chars": 16, "max_buffer_chars": 32, "run_cut_han": 4, "run_cut_look": 2}
N = 512


class CountingPattern:
    """A compiled pattern that adds the characters each call spans to a meter."""

    def __init__(self, pattern: re.Pattern[str], meter: WorkMeter) -> None:
        self._pattern, self._meter = pattern, meter

    def _span(self, string: str, pos: int, endpos: int) -> int:
        return max(0, min(endpos, len(string)) - pos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        m = self._pattern.search(string, pos, endpos)
        self._meter.work += (m.end() - pos) if m else self._span(string, pos, endpos)
        return m

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        self._meter.work += self._span(string, pos, endpos)
        return self._pattern.match(string, pos, endpos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        self._meter.work += self._span(string, pos, endpos)
        return self._pattern.fullmatch(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        self._meter.work += self._span(string, pos, endpos)
        return self._pattern.findall(string, pos, endpos)

    def finditer(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[str]]:
        self._meter.work += self._span(string, pos, endpos)
        return self._pattern.finditer(string, pos, endpos)

    def sub(self, repl: Any, string: str, count: int = 0) -> str:
        self._meter.work += len(string)
        return self._pattern.sub(repl, string, count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pattern, name)


class WorkMeter:
    """Counts the work of the segmentation package while running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.work = 0
        for module in (segmenter_module, chars_module):
            for name, value in list(vars(module).items()):
                if isinstance(value, re.Pattern):
                    monkeypatch.setattr(module, name, CountingPattern(value, self))
                elif isinstance(value, dict):
                    for key, item in value.items():
                        if isinstance(item, re.Pattern):
                            monkeypatch.setitem(value, key, CountingPattern(item, self))
        jieba_cuts, pysbd_splits = jieba_pysbd.jieba_cuts, jieba_pysbd.pysbd_splits

        def counted_jieba(run: str) -> list[int]:
            self.work += len(run)
            return jieba_cuts(run)

        def counted_pysbd(text: str, at: int) -> bool:
            self.work += len(text)
            return pysbd_splits(text, at)

        monkeypatch.setattr(jieba_pysbd, "jieba_cuts", counted_jieba)
        monkeypatch.setattr(jieba_pysbd, "pysbd_splits", counted_pysbd)

    def _trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename.startswith(SEGMENTATION_DIR):
            return self._count_lines
        return None

    def _count_lines(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.work += 1
        return self._count_lines

    def measure(self, fn: Any, *args: Any, **kwargs: Any) -> int:
        """The work of fn(*args, **kwargs)."""
        before, previous = self.work, sys.gettrace()
        sys.settrace(self._trace)
        try:
            fn(*args, **kwargs)
        finally:
            sys.settrace(previous)
        return self.work - before


def chop(text: str, how: str) -> list[str]:
    if how == "one":
        return [text]
    if how == "slices":
        return [text[i : i + 7] for i in range(0, len(text), 7)]
    rng = random.Random(len(text))
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, 3)
        out.append(text[i : i + k])
        i += k
    return out


def run(text: str, granularity: str, how: str, *, poll: bool = False) -> list[Segment]:
    now = [0.0]
    seg = StreamSegmenter(granularity=granularity, clock=lambda: now[0], **POLICY)  # type: ignore[arg-type]
    bound = POLICY["max_buffer_chars"] if granularity == "none" else POLICY["max_chars"]
    out: list[Segment] = []
    for d in chop(text, how):
        out += seg.feed(d)
        if poll:
            now[0] += 2.0  # the LLM stalls after every delta: poll may commit a clean tail
            out += seg.poll(now[0])
        assert len(seg.pending) <= bound
    return out + seg.flush()


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    segmentation.warm_up()  # jieba's dictionary and pysbd's rules load once, outside any count


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("shape", sorted(SEGMENTER_SHAPES))
def test_work_grows_linearly_with_the_text(shape: str, granularity: str, monkeypatch: pytest.MonkeyPatch) -> None:
    meter = WorkMeter(monkeypatch)
    small, big = (SEGMENTER_SHAPES[shape](n) for n in (N, 8 * N))
    for how in ("one", "slices"):  # one delta; 7-character deltas, whose decisions wait and resume
        w_small = meter.measure(run, small, granularity, how)
        w_big = meter.measure(run, big, granularity, how)
        assert w_big <= 9 * w_small, f"{shape}/{granularity}/{how}: work ×{w_big / w_small:.1f} for 8× the text"


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("shape", sorted(SEGMENTER_SHAPES))
def test_hostile_text_round_trips_the_same_whatever_the_chop(shape: str, granularity: str) -> None:
    text = SEGMENTER_SHAPES[shape](3 * N + 7)
    one = run(text, granularity, "one")
    assert "".join(s.text for s in one) == text
    pos = 0
    for s in one:
        assert s.text and s.start == pos and s.text == text[s.start : s.end]
        pos = s.end
    assert run(text, granularity, "slices") == one
    assert run(text, granularity, "random") == one
    polled = run(text, granularity, "slices", poll=True)
    assert "".join(s.text for s in polled) == text


def test_the_meter_sees_a_rescan() -> None:
    """The count is honest: a scan that rereads its buffer at every step costs quadratic work."""

    def rescan(text: str) -> None:
        for i in range(0, len(text), 32):
            chars_module.LATIN_WORD_RE.findall(text, i)

    with pytest.MonkeyPatch.context() as mp:
        meter = WorkMeter(mp)
        w_small = meter.measure(rescan, "x " * N)
        w_big = meter.measure(rescan, "x " * 8 * N)
    assert w_big > 30 * w_small
