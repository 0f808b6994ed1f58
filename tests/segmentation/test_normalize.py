"""normalize_for_speech: Markdown and emoji out, numbers read the way a voice should."""

from __future__ import annotations

import pytest
from hostile_text import NORMALIZER_SHAPES
from hypothesis import given
from hypothesis import strategies as st

from segmentation import normalize_for_speech
from segmentation.numbers import en_cardinal, en_integer, en_ordinal, en_ordinal_of, en_year, zh_cardinal, zh_integer


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"), (13, "thirteen"), (40, "forty"), (99, "ninety-nine"), (100, "one hundred"),
        (1024, "one thousand twenty-four"), (1_250_000, "one million two hundred fifty thousand"),
        (-7, "minus seven"),
    ],
)  # fmt: skip
def test_english_cardinals(n: int, words: str) -> None:
    assert en_cardinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [(1, "first"), (2, "second"), (3, "third"), (12, "twelfth"), (20, "twentieth"), (21, "twenty-first"),
     (100, "one hundredth")],
)  # fmt: skip
def test_english_ordinals(n: int, words: str) -> None:
    assert en_ordinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [(1990, "nineteen ninety"), (2008, "two thousand eight"), (2010, "twenty ten"),
     (1905, "nineteen oh five"), (1900, "nineteen hundred"), (2000, "two thousand")],
)  # fmt: skip
def test_english_years(n: int, words: str) -> None:
    assert en_year(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "零"), (10, "十"), (12, "十二"), (20, "二十"), (105, "一百零五"), (110, "一百一十"),
        (1005, "一千零五"), (1050, "一千零五十"), (10005, "一万零五"), (12500, "一万二千五百"),
        (1_250_000, "一百二十五万"), (100_010_000, "一亿零一万"), (100_000_012, "一亿零一十二"),
    ],
)  # fmt: skip
def test_mandarin_cardinals(n: int, words: str) -> None:
    assert zh_cardinal(n) == words


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        (
            "Your balance is $1,024.50 as of today.",
            "Your balance is one thousand twenty-four dollars and fifty cents as of today.",
        ),
        ("It costs $1 or €2.", "It costs one dollar or two euros."),
        ("Revenue hit $3.5M.", "Revenue hit three point five million dollars."),
        (
            "The rate rose to 3.75% this quarter.",
            "The rate rose to three point seven five percent this quarter.",
        ),
        ("The meeting starts at 10:30 sharp.", "The meeting starts at ten thirty sharp."),
        ("Call at 9:05 AM or 3 p.m. today.", "Call at nine oh five a m or three p m today."),
        ("Lunch is at 12:00.", "Lunch is at twelve o'clock."),
        ("On 2024-03-05 we shipped.", "On March fifth, twenty twenty-four we shipped."),
        ("That is the highest since 2008!", "That is the highest since two thousand eight!"),
        ("It is 25°C and 5 km away.", "It is twenty-five degrees Celsius and five kilometers away."),
        ("It weighs 1 kg, not 2kg.", "It weighs one kilogram, not two kilograms."),
        ("Drive 60 mph for 3 kWh.", "Drive sixty miles per hour for three kilowatt hours."),
        ("She came 1st and he came 22nd.", "She came first and he came twenty-second."),
        ("Upgrade to 2.4.1 now.", "Upgrade to two point four point one now."),
        ("It was -5 outside.", "It was minus five outside."),
        ("Send it to jane.doe@acme.co.uk now.", "Send it to jane dot doe at acme dot co dot uk now."),
        ("See example.com/downloads today.", "See example dot com slash downloads today."),
        ("Tom & Jerry: 3 + 4 = 7", "Tom and Jerry: three plus four equals seven"),
        ("Dial 007 now.", "Dial zero zero seven now."),
        (
            "Dr. Smith and Mr. Lee met in St. Louis, e.g. at No. 5 Main St.",
            ("Doctor Smith and Mister Lee met in Saint Louis, for example at number five Main St."),
        ),
    ],
)
def test_english_readings(text: str, spoken: str) -> None:
    assert normalize_for_speech(text, "en") == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("今年的增长率是3.5%，比去年高。", "今年的增长率是百分之三点五，比去年高。"),
        ("总价是12,500元。", "总价是一万二千五百元。"),
        ("余额是1,024.50元。", "余额是一千零二十四点五元。"),
        ("会议在2026年3月5日下午3:30开始。", "会议在二零二六年三月五日下午三点三十分开始。"),
        ("我们2个人，2:05到。", "我们两个人，两点零五分到。"),
        ("价格是¥99。", "价格是九十九元。"),
        ("气温25°C，距离5km。", "气温二十五摄氏度，距离五公里。"),
        ("我用 Python 3.11 写了这个脚本。", "我用 Python 三点一一 写了这个脚本。"),
    ],
)
def test_mandarin_readings(text: str, spoken: str) -> None:
    assert normalize_for_speech(text, "auto") == spoken
    assert normalize_for_speech(text, "zh") == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("**Bold** and *italic* and __strong__ and _em_", "Bold and italic and strong and em"),
        ("## Summary\nThe plan works.", "Summary\nThe plan works."),
        ("- reset the router\n* call support\n+ wait", "reset the router\ncall support\nwait"),
        ("Read [the docs](https://x.io/a) and ![a cat](cat.png).", "Read the docs and a cat."),
        ("Run `make test` first.", "Run make test first."),
        ("Here:\n```python\nprint('hi')\n```\nDone.", "Here:\n\nDone."),
        ("Code:\n```\nx = 1  # a fence left open is code to its end", "Code:"),
        ("> quoted line", "quoted line"),
        ("Great job 🎉👍🏽 today ✅", "Great job today"),
        ("~~old~~ new", "old new"),
        ("a | b | c", "a b c"),
        ("<b>hi</b> there", "hi there"),
        ("snake_case_name stays", "snake_case_name stays"),
        ("---", ""),
    ],
)
def test_markdown_and_emoji_are_not_read_aloud(text: str, spoken: str) -> None:
    assert normalize_for_speech(text, "en") == spoken


def test_mixed_english_sentence_with_a_han_name_reads_numbers_in_english() -> None:
    assert normalize_for_speech("The dish 宫保鸡丁 costs $12 at 7:30 tonight.") == (
        "The dish 宫保鸡丁 costs twelve dollars at seven thirty tonight."
    )


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        normalize_for_speech(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="surrogate"):
        normalize_for_speech("x\udc00y")


@given(st.text(max_size=300).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
def test_any_text_normalizes_without_error_or_leftover_markup(text: str) -> None:
    out = normalize_for_speech(text, "en")
    assert "**" not in out and "`" not in out


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("shape", sorted(NORMALIZER_SHAPES))
def test_hostile_text_normalizes(shape: str, language: str) -> None:
    """Every shape that made a pattern backtrack (bench: segmentation_bench.py --hostile) still reads."""
    out = normalize_for_speech(NORMALIZER_SHAPES[shape](8192), language)
    assert "**" not in out and "`" not in out


def test_a_number_of_any_length_is_read_digit_by_digit() -> None:
    # int() of more than 4300 digits raised ValueError: the segment was lost.
    assert normalize_for_speech("1" * 5000, "en") == " ".join(["one"] * 5000)
    assert normalize_for_speech("7" * 5000, "zh") == "七" * 5000
    assert normalize_for_speech("$" + "2" * 5000 + " now", "en").endswith("two dollars now")
    assert normalize_for_speech("3" * 5000 + "th", "en").endswith("three three third")


@given(st.integers(0, 10**40), st.integers(0, 3))
def test_digit_strings_read_as_their_value(n: int, zeros: int) -> None:
    digits = "0" * zeros + str(n)
    assert en_integer(digits) == en_cardinal(n)
    assert zh_integer(digits) == zh_cardinal(n)
    assert en_ordinal_of(digits) == en_ordinal(n)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("See [the page](https://en.wikipedia.org/wiki/Foo_(bar)) now.", "See the page now."),
        ("Mail -jane@acme.io or visit -acme.io today.", "Mail -jane at acme dot io or visit -acme dot io today."),
        ("a   &   b", "a and b"),
        ("a\n\n```\ncode\n```\nb", "a\n\n\nb"),
        ("| a |\n|---|\n| 1 |", "a\n\none"),
    ],
)
def test_readings_kept_by_the_linear_patterns(text: str, spoken: str) -> None:
    assert normalize_for_speech(text, "en") == spoken


@pytest.mark.parametrize(
    ("text", "language", "spoken"),
    [
        ("请访问127.0.0.1查看", "zh", "请访问幺二七点零点零点幺查看"),
        ("Ping 127.0.0.1 now", "en", "Ping one two seven dot zero dot zero dot one now"),
        ("请拨打12315投诉", "zh", "请拨打幺二三幺五投诉"),
        ("客服10086", "zh", "客服幺零零八六"),  # a carrier's service line, with no code word
        ("人口12315人", "zh", "人口一万二千三百一十五人"),  # a count: a measure word follows
        ("手机13812345678", "zh", "手机幺三八幺二三四五六七八"),
        ("验证码是4821", "zh", "验证码是四八二幺"),
        ("Call 911 now", "en", "Call nine one one now"),
        ("I recall 911 things", "en", "I recall nine hundred eleven things"),
        ("排名第3rd。", "zh", "排名第三。"),
        ("3rd名", "en", "third名"),
        (".5 seconds", "en", "point five seconds"),
        (".5秒", "zh", "零点五秒"),
        ("例如e.g.中文说明", "zh", "例如例如中文说明"),
        ("参见Dr. Smith的论文", "zh", "参见Doctor Smith的论文"),
        ("¥1,024.50万元", "zh", "一千零二十四点五万元"),
        ("$5万", "zh", "五万美元"),
    ],
)
def test_readings_of_codes_ordinals_decimals_and_glued_abbreviations(text: str, language: str, spoken: str) -> None:
    assert normalize_for_speech(text, language) == spoken
