"""Numbers as words, in English and Mandarin: the readings a voice needs."""

from __future__ import annotations

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_EXCEPTIONS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}  # fmt: skip
MONTHS = "January February March April May June July August September October November December".split()


def en_cardinal(n: int) -> str:
    if n < 0:
        return "minus " + en_cardinal(-n)
    if n >= 10**15:
        return en_digits(str(n))
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + en_cardinal(rest))
    for value, name in _SCALES:
        if n >= value:
            rest = n % value
            return en_cardinal(n // value) + " " + name + ("" if rest == 0 else " " + en_cardinal(rest))
    raise AssertionError(n)


def en_integer(digits: str) -> str:
    """A string of digits read as en_cardinal reads its value, without int(): converting thousands
    of digits takes quadratic time, and Python refuses past 4300. Past the scales, digit by digit."""
    digits = digits.lstrip("0") or "0"
    return en_digits(digits) if len(digits) > 15 else en_cardinal(int(digits))  # n >= 10**15


def en_ordinal(n: int) -> str:
    return _ordinal(en_cardinal(n))


def en_ordinal_of(digits: str) -> str:
    """en_ordinal of a string of digits, of any length."""
    return _ordinal(en_integer(digits))


def _ordinal(words: str) -> str:
    head, sep, last = words.rpartition(" ") if " " in words else ("", "", words)
    pre, dash, unit = last.rpartition("-")
    if unit in _ORDINAL_EXCEPTIONS:
        unit = _ORDINAL_EXCEPTIONS[unit]
    elif unit.endswith("y"):
        unit = unit[:-1] + "ieth"
    else:
        unit += "th"
    return head + sep + pre + dash + unit


def en_digits(digits: str) -> str:
    return " ".join(_ONES[int(d)] for d in digits if d.isdigit())


def en_year(n: int) -> str:
    """1990 → nineteen ninety, 2008 → two thousand eight, 2010 → twenty ten, 1905 → nineteen oh five."""
    if 2000 <= n <= 2009 or n % 1000 == 0:
        return en_cardinal(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return en_cardinal(hi) + " hundred"
    return en_cardinal(hi) + " " + (("oh " + _ONES[lo]) if lo < 10 else en_cardinal(lo))


def en_decimal(integer: str, fraction: str) -> str:
    return en_integer(integer) + " point " + en_digits(fraction)


def en_time(h: int, m: int) -> str:
    if m == 0:
        return en_cardinal(h) + " o'clock"
    return en_cardinal(h) + " " + (("oh " + _ONES[m]) if m < 10 else en_cardinal(m))


_ZH_DIGITS = "零一二三四五六七八九"
_ZH_SMALL = ((1000, "千"), (100, "百"), (10, "十"))


def _zh_below_10000(n: int) -> str:
    out, zero = "", False
    for value, name in _ZH_SMALL:
        d, n = divmod(n, value)
        if d:
            if zero:
                out += "零"
            out += _ZH_DIGITS[d] + name
            zero = False
        elif out:
            zero = True
    if n:
        out += ("零" if zero or (out and not out.endswith("十")) else "") + _ZH_DIGITS[n]
    return out


def zh_cardinal(n: int) -> str:
    if n < 0:
        return "负" + zh_cardinal(-n)
    if n == 0:
        return "零"
    if n >= 10**16:
        return zh_digits(str(n))
    groups = []
    while n:
        n, g = divmod(n, 10000)
        groups.append(g)
    out, pending_zero = "", False
    for idx in range(len(groups) - 1, -1, -1):
        g = groups[idx]
        if g == 0:
            pending_zero = bool(out)
            continue
        if out and (pending_zero or g < 1000):
            out += "零"
        out += _zh_below_10000(g) + ("", "万", "亿", "万亿")[idx]
        pending_zero = False
    # 一十二 is read 十二 at the start of a number.
    return out[1:] if out.startswith("一十") else out


def zh_integer(digits: str) -> str:
    """A string of digits read as zh_cardinal reads its value, without int() (see en_integer)."""
    digits = digits.lstrip("0") or "0"
    return zh_digits(digits) if len(digits) > 16 else zh_cardinal(int(digits))  # n >= 10**16


def zh_digits(digits: str) -> str:
    return "".join(_ZH_DIGITS[int(d)] for d in digits if d.isdigit())


def zh_code(digits: str) -> str:
    """Digits of a code read one by one, as Mandarin reads phone and service numbers: 1 is 幺 (12315 →
    幺二三幺五), so that it is not heard as 七."""
    return zh_digits(digits).replace("一", "幺")


def zh_decimal(integer: str, fraction: str) -> str:
    return zh_integer(integer) + "点" + zh_digits(fraction)
