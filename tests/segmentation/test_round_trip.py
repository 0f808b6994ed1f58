"""Nothing lost, nothing duplicated: for any text and any way of chopping it into deltas."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from segmentation import StreamSegmenter

# Text built from the pieces that exercise every rule: words, numbers, marks, closers, Han, fences.
PIECES = st.sampled_from(
    [
        "Dr",
        "Smith",
        "e.g",
        "U.S",
        "3",
        "14",
        "1,000",
        "10:30",
        "example",
        "com",
        "Inc",
        "a",
        "I",
        "你好",
        "明天见",
        "我们",
        "系统",
        "Python",
        "…",
        "……",
        "...",
        ".",
        "!",
        "?",
        "。",
        "！",
        "？",
        ",",
        ";",
        ":",
        "，",
        "、",
        "；",
        "：",
        "—",
        '"',
        "'",
        "”",
        "」",
        "）",
        ")",
        "《",
        "》",
        " ",
        " ",
        "  ",
        "\n",
        "\n\n",
        "```",
        "`",
        "-",
        "*",
        "#",
        "$",
        "%",
        "😀",
        "\u3000",
    ]
)
TEXTS = st.one_of(
    st.lists(PIECES, max_size=80).map("".join),
    st.text(max_size=200).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
)


@st.composite
def chopped(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(TEXTS)
    cuts = sorted(draw(st.sets(st.integers(0, max(0, len(text))), max_size=40)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chopped(),
    st.sampled_from(["none", "sentence", "clause", "auto"]),
    st.integers(16, 80),
    st.lists(st.booleans(), max_size=60),
)
def test_segments_concatenate_to_the_input(
    case: tuple[str, list[str]], granularity: str, max_chars: int, polls: list[bool]
) -> None:
    text, deltas = case
    clock = [0.0]
    seg = StreamSegmenter(granularity=granularity, max_chars=max_chars, clock=lambda: clock[0])
    out = []
    for i, d in enumerate(deltas):
        out += seg.feed(d)
        if i < len(polls) and polls[i]:
            clock[0] += 2.0  # the LLM stalls; poll may commit a clean tail
            out += seg.poll(clock[0])
        assert len(seg.pending) <= (seg.policy.max_buffer_chars if granularity == "none" else max_chars)
    out += seg.flush()
    assert "".join(s.text for s in out) == text
    pos = 0
    for s in out:
        assert s.start == pos and s.end == pos + len(s.text) and s.text == text[s.start : s.end]
        assert s.text, "empty segment"
        pos = s.end


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chopped(), st.sampled_from(["none", "sentence", "clause", "auto"]), st.integers(16, 80))
# A look past a mark that ran to the end of a one-delta text made segments longer than max_chars,
# where the same text in small deltas was cut at max_chars.
@example(("ab." + " " * 40 + "Cd", list("ab." + " " * 40 + "Cd")), "sentence", 16)
@example(("ab" + "\n" * 40 + "x", list("ab" + "\n" * 40 + "x")), "auto", 16)
@example(("ab" + "…" * 40 + " C", list("ab" + "…" * 40 + " C")), "clause", 16)
def test_the_segments_do_not_depend_on_the_chop(case: tuple[str, list[str]], granularity: str, max_chars: int) -> None:
    """The same text gives the same segments in one delta or in any chop (poll aside: it is timed).
    Forced cuts included: what a cut looks at never goes past the bound, whatever has arrived."""
    text, deltas = case

    def segments(parts: list[str]) -> list[tuple[str, int, int, str]]:
        seg = StreamSegmenter(granularity=granularity, max_chars=max_chars, max_buffer_chars=max_chars)
        out = [s for d in parts for s in seg.feed(d)] + seg.flush()
        return [(s.text, s.start, s.end, s.reason) for s in out]

    assert segments(deltas) == segments([text])
