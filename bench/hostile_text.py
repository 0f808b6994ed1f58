"""Text shaped to hurt a streaming segmenter or a normaliser: each shape's worst case, at any length.

Shared by the hostile-input benchmark (bench/segmentation_bench.py --hostile) and the linearity tests
(tests/segmentation/test_linear.py): the same shapes are timed there and counted here.
"""

from __future__ import annotations

from collections.abc import Callable

_PROSE = "The quick brown fox jumps over the lazy dog, again and again. 你好，世界。Then we rest. "
_HAN = "我们的系统会自动根据您的使用习惯推荐最合适的套餐方案并在每个月初发送详细的账单说明给您"
# Rare ideographs (CJK Extension A) that jieba's dictionary lacks: its HMM decides every word.
_RARE_HAN = "".join(chr(0x3400 + (i * 37) % 6500) for i in range(512))


def _repeat(unit: str) -> Callable[[int], str]:
    return lambda n: (unit * (n // len(unit) + 1))[:n]


def _after(head: str, fill: str) -> Callable[[int], str]:
    return lambda n: head + fill * max(0, n - len(head))


# Shapes for the segmenter: runs it cannot end, marks it must look past, decisions that cost the most.
SEGMENTER_SHAPES: dict[str, Callable[[int], str]] = {
    "prose": _repeat(_PROSE),  # the baseline: what an LLM really sends
    "no_punctuation": _repeat("alpha beta gamma delta epsilon zeta eta theta "),
    "only_spaces": _repeat(" "),
    "giant_token": _repeat("x"),
    "han_run": _repeat(_HAN),
    "rare_han_run": _repeat(_RARE_HAN),
    "newlines": _repeat("\n"),
    "period_then_spaces": _after("Hello.", " "),
    "period_then_closers": _after("Hello.", ")"),
    "terminator_run": _repeat("!"),
    "dots": _repeat("."),
    "dashes": _repeat("—"),
    "backticks": _repeat("`"),
    "fences": _repeat("```\n"),
    "open_fence": _after("```py\n", "x = 1. y = 2, z; "),
    "han_clause_marks": _repeat("、"),  # clause marks with nothing to count: never long enough
    "latin_clause_marks": _repeat(", "),
    "short_han_clauses": _repeat("好，"),
    "ellipses": _repeat("… "),
    "initialisms": _repeat("U.S. "),  # each one asks pysbd, and pysbd says no
    "abbreviations": _repeat("e.g. E "),
    "ambiguous_abbreviations": _repeat("Acme Inc. It "),
    # Atoms (segmentation/atoms.py): every cut candidate binds a number to what follows it.
    "spaced_digits": _repeat("1 "),
    "numbers_and_units": _repeat("25 kg 2026年 12.5% 08:30 "),
    "han_numbers": _repeat("预计2026年底温度25摄氏度距离4公里"),
    "dotted_digits": _repeat("1."),
    "glued_abbreviations": _repeat("例如e.g.参见Dr. Smith的"),
    "code_words": _repeat("请拨打12315 call 911 "),
}

# Shapes for normalize_for_speech: inputs that make a backtracking regex try every start position.
NORMALIZER_SHAPES: dict[str, Callable[[int], str]] = {
    "prose": _repeat(_PROSE),
    "digits": _repeat("1"),
    "digit_groups": _after("1", ",000"),
    "dotted_digits": _repeat("1."),
    "spaces": _after("a", " "),
    "newlines": _after("a", "\n"),
    "tabs_line": _after("a\n", "\t"),
    "stars": _repeat("*"),
    "open_strong": _repeat(" **a"),
    "open_em": _repeat(" *a"),
    "underscores": _repeat("_"),
    "open_brackets": _repeat("["),
    "open_images": _repeat("!["),
    "open_link_targets": _repeat("[a]("),
    "open_parens": _repeat("("),
    "open_tags": _repeat("<a"),
    "backticks": _repeat("`"),
    "dollars": _repeat("$"),
    "dollar_digits": _repeat("$1"),
    "hyphenated": _repeat("a-"),
    "dotted_words": _repeat("a."),
    "url_ish": _repeat("www.a"),
    "email_ish": _repeat("a.b@"),
    "ampersands": _repeat(" & "),
    # Digits read one by one and readings glued to Han text (issue 38).
    "dotted_quads": _repeat("1.1.1.1."),
    "code_words": _repeat("电话1"),
    "call_digits": _repeat("call 1"),
    "leading_dots": _repeat(" .1"),
    "ordinals": _repeat("第1st"),
    "yuan_scales": _repeat("¥1万元"),
}
