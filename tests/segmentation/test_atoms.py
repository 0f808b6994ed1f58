"""No cut splits an atom (segmentation/atoms.py): a span whose reading depends on its neighbours.

Audio has no undo: "完成率12." then "5%" is heard as "十二." and "five percent". Each case names its
atoms; every cut the segmenter makes (idle, forced, sentence, clause, the Mandarin word cut) must fall
outside them, whether the text comes a character at a time, in random packets, or with a stall (a
fake clock past the idle timeout) at every position.
"""

from __future__ import annotations

import random

import pytest

from segmentation import Segment, StreamSegmenter
from segmentation.atoms import ATOM_MAX, safe_end, splits_atom

# (text, its atoms). Mandarin and English: numbers with decimals, percent, units, currencies, times,
# dates, years, ordinals, versions, addresses, dotted abbreviations.
CASES: list[tuple[str, list[str]]] = [
    ("完成率12.5%。", ["12.5%"]),
    ("时间08:30开始。", ["08:30"]),
    ("距离0.5公里。", ["0.5公里"]),
    ("例如e.g.中文说明。", ["e.g."]),
    ("温度25摄氏度，功率3千瓦时。", ["25摄", "3千"]),
    ("预计2026年底完成。", ["2026年"]),
    ("公司2026年度报告。", ["2026年"]),
    ("价格是¥24.50元，折扣8.5折。", ["¥24.50元", "8.5折"]),
    ("会议在2026-05-01举行。", ["2026-05-01"]),
    ("排名第3rd。", ["第3rd"]),
    ("请访问127.0.0.1查看。", ["127.0.0.1"]),
    ("版本v2.10.3已发布。", ["v2.10.3"]),
    ("重量25 kg左右。", ["25 kg"]),
    ("人口1,250,000人。", ["1,250,000人"]),
    ("The rate is 12.5% now.", ["12.5%"]),
    ("Meet at 08:30 sharp.", ["08:30"]),
    ("It is 0.5 km away.", ["0.5 km"]),
    ("Use a tag, e.g. the city.", ["e.g."]),
    ("Install v2.1 today.", ["v2.1"]),
    ("Ping 127.0.0.1 now.", ["127.0.0.1"]),
    ("It weighs 25 kg.", ["25 kg"]),
    ("It costs $1,024.50 today.", ["$1,024.50"]),
    ("The temperature is -3.5°C outside.", ["-3.5°C"]),
    ("See you at 3 p.m. tomorrow.", ["3 p.m."]),
    ("Due on 2026-05-01 at noon.", ["2026-05-01"]),
    ("She came 3rd in the race.", ["3rd"]),
    ("Sales hit €2.5 million.", ["€2.5"]),
    # A code word and its digits: 拨打 makes 12315 a service number, read 幺二三幺五.
    ("请拨打12315投诉。", ["拨打12315"]),
    ("您的验证码是4821，请输入。", ["验证码是4821"]),
    ("Call 911 now.", ["Call 911"]),
    ("The delay is .5 seconds.", [".5"]),
]


def cuts(segs: list[Segment]) -> list[int]:
    return [s.end for s in segs[:-1]]


def inside(text: str, atoms: list[str]) -> set[int]:
    """Offsets strictly inside an occurrence of an atom."""
    out: set[int] = set()
    for atom in atoms:
        at = text.find(atom)
        assert at >= 0, atom
        while at >= 0:
            out |= set(range(at + 1, at + len(atom)))
            at = text.find(atom, at + 1)
    return out


def check(text: str, atoms: list[str], segs: list[Segment]) -> None:
    assert "".join(s.text for s in segs) == text
    bad = [c for c in cuts(segs) if c in inside(text, atoms)]
    assert not bad, f"cut inside an atom at {bad}: {[s.text for s in segs]}"


def stream(
    text: str, deltas: list[str], stalls: set[int], granularity: str = "auto", **policy: object
) -> list[Segment]:
    """Feed `deltas`; after the delta ending at each offset in `stalls`, the clock jumps past the idle
    timeout and poll() runs."""
    now = [0.0]
    seg = StreamSegmenter("auto", granularity, clock=lambda: now[0], **policy)  # type: ignore[arg-type]
    out: list[Segment] = []
    pos = 0
    for d in deltas:
        now[0] += 0.01
        out += seg.feed(d)
        pos += len(d)
        if pos in stalls:
            now[0] += 5.0
            out += seg.poll(now[0])
    out += seg.flush()
    return out


@pytest.mark.parametrize("granularity", ["auto", "clause", "sentence"])
@pytest.mark.parametrize(("text", "atoms"), CASES, ids=[c[0] for c in CASES])
def test_a_stall_at_any_one_position_never_splits_an_atom(text: str, atoms: list[str], granularity: str) -> None:
    for p in range(1, len(text)):
        check(text, atoms, stream(text, list(text), {p}, granularity))


@pytest.mark.parametrize(("text", "atoms"), CASES, ids=[c[0] for c in CASES])
def test_a_stall_after_every_character_never_splits_an_atom(text: str, atoms: list[str]) -> None:
    check(text, atoms, stream(text, list(text), set(range(1, len(text) + 1))))


@pytest.mark.parametrize(("text", "atoms"), CASES, ids=[c[0] for c in CASES])
def test_random_packets_and_stalls_never_split_an_atom(text: str, atoms: list[str]) -> None:
    for seed in range(20):
        rng = random.Random(seed)
        deltas, i = [], 0
        while i < len(text):
            k = rng.randint(1, 5)
            deltas.append(text[i : i + k])
            i += k
        ends = {sum(map(len, deltas[: n + 1])) for n in range(len(deltas))}
        stalls = {e for e in ends if rng.random() < 0.4}
        check(text, atoms, stream(text, deltas, stalls))


def test_the_reported_pauses_speak_the_left_context_and_hold_the_atom() -> None:
    for text, head in [("完成率12.5%", "完成率"), ("时间08:30", "时间"), ("距离0.5公里", "距离"), ("例如e.g.", "例如"),
                       ("Install v2.1", "Install "), ("Go to 127.0.0.1", "Go to ")]:  # fmt: skip
        held = text[len(head) : text.index(".", len(head)) + 1] if "." in text[len(head) :] else ""
        if text.startswith("时间"):
            held = "08:"
        segs = stream(text, [head + held, text[len(head + held) :]], {len(head + held)})
        assert [(s.text, s.reason) for s in segs] == [(head, "timeout"), (text[len(head) :], "flush")], text


def test_a_clean_tail_with_no_atom_still_goes_at_the_pause() -> None:
    segs = stream("Let me check that for you. OK", ["Let me check that for you.", " OK"], {26})
    assert [s.text for s in segs] == ["Let me check that for you.", " OK"]


@pytest.mark.parametrize(("text", "atoms"), CASES, ids=[c[0] for c in CASES])
def test_the_forced_cut_never_splits_an_atom(text: str, atoms: list[str]) -> None:
    """The bound falls at every offset of every atom: a filler of varied length before the case."""
    for pad in range(0, 20):
        filler = "word " * pad + "x" * (pad % 3) + " "
        if "\u4e00" <= text[0] <= "\u9fff":
            filler = "一二三四五六七八九十" * 2 + "甲" * pad
        full = filler + text
        for granularity in ("sentence", "none"):
            segs = stream(full, list(full), set(), granularity, max_chars=16, max_buffer_chars=16)
            check(full, atoms, segs)


@pytest.mark.parametrize(
    ("text", "atom"),
    [
        ("预计2026年底", "2026年"),
        ("公司2026年度", "2026年"),
        ("温度25摄氏度", "25摄"),
        ("距离4公里", "4公"),
        ("功率3千瓦时", "3千"),
        ("花费2026元", "2026元"),
        ("重量25 kg", "25 kg"),
    ],
)
def test_the_mandarin_word_cut_never_splits_a_number_from_its_unit(text: str, atom: str) -> None:
    """A long run with no mark, the number at every offset of the run cut's window."""
    run = "我们的系统会自动根据您的使用习惯推荐最合适的套餐方案并在每个月初发送详细的账单说明给您"
    for pad in range(0, 28):
        full = run[:pad] + text + run
        for deltas in (list(full), [full]):
            segs = stream(full, deltas, set(), "auto")
            check(full, [atom], segs)


def test_the_forced_cut_at_300_keeps_2026_yuan_and_25_kg() -> None:
    for atom in ("2026元", "25 kg"):
        for pad in range(290, 300):
            full = "好" * pad + atom + "好" * 40
            segs = stream(full, list(full), set(), "sentence", run_cut_han=0)
            check(full, [atom], segs)
            assert all(len(s.text) <= 300 for s in segs)


# -- glued abbreviations, leading decimals -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "例如e.g.中文说明。然后",
        "参见Dr. Smith的论文。然后",
        "请联系Mr. Wang确认。然后",
        "比如U.S.A. 的政策。然后",
        "例如i.e.就是说。然后",
        "参见Prof. Li的书。然后",
    ],
)
def test_a_latin_abbreviation_glued_to_han_text_ends_no_sentence(text: str) -> None:
    for granularity in ("sentence", "auto"):
        seg = StreamSegmenter(granularity=granularity)
        out = [s for ch in text for s in seg.feed(ch)]
        assert [s.text for s in out] == [text[: text.index("。") + 1]], granularity


def test_a_leading_decimal_after_a_han_terminator_stays_whole() -> None:
    seg = StreamSegmenter(granularity="sentence")
    out = [s for ch in "Value:。.5 seconds. Then" for s in seg.feed(ch)]
    assert [s.text for s in out] == ["Value:。", ".5 seconds. "]


# -- the recogniser itself ----------------------------------------------------------------------


def test_an_atom_longer_than_the_bound_is_not_held() -> None:
    text = "数字" + "1." * ATOM_MAX
    assert safe_end(text, 0, len(text)) == len(text)  # a dotted chain past ATOM_MAX: no reading unit
    short = "数字12."
    assert safe_end(short, 0, len(short)) == 2


def test_unarrived_text_is_unknown() -> None:
    assert splits_atom("12.", 3)  # 12.5 may come
    assert splits_atom("08:", 3)
    assert splits_atom("25 ", 3)  # kg may come
    assert splits_atom("e.", 2) and splits_atom("例如e.g.", 6)
    assert splits_atom("v2.", 3)
    assert not splits_atom("you.", 4)  # a word's end
    assert not splits_atom("12。", 3)
    assert splits_atom("12.5", 2, hi=3)  # what lies at or past hi is not looked at
    assert not splits_atom("12. Then", 3)
    assert splits_atom("Value: .", 8)  # .5 may come
    assert not splits_atom("Well...", 7)
    assert splits_atom("Call ", 5) and splits_atom("拨打110", 2) and splits_atom("电话：12315", 3)
    assert not splits_atom("recall 5", 7) and not splits_atom("Call me", 5)
