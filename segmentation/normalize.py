"""normalize_for_speech: what a voice should read, from what an LLM writes.

A pure function applied to each committed segment (so no rewrite ever straddles a commit). Markdown
and emoji go; numbers, money, percentages, dates, times and units become words, in English or
Mandarin by the segment's language. Order matters: code and links first (their text is literal),
then patterns with context (money, dates, times, units), then bare numbers.

A segment can be 64 KiB (`none` mode), so every pattern is linear in its input: none may start at
every position of a run and scan to the run's end. A pattern that can fail after a long scan either
starts only where its run starts (a look-behind), or stops its scan at the next character that could
begin another attempt (`[^<>]` in a tag, `[^()]` in a link target, no delimiter inside emphasis).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from segmentation import atoms
from segmentation import numbers as nb
from segmentation.chars import HAN_RE, LATIN_WORD_RE, check_text

# -- Markdown, emoji, symbols -------------------------------------------------------------------

_FENCE_BLOCK = re.compile(r"```[^\n`]*\n.*?(?:```|\Z)", re.S)  # no backtick in an info string
_FENCE_LINE = re.compile(r"^[ \t]*```.*$", re.M)
# A link target may hold one level of parentheses (Foo_(bar)); text and target never another opener.
_TARGET = r"\([^()]*(?:\([^()]*\)[^()]*)*\)"
_IMAGE = re.compile(r"!\[([^\[\]]*)\]" + _TARGET)
_LINK = re.compile(r"\[([^\[\]]+)\]" + _TARGET)
_INLINE_CODE = re.compile(r"`+([^`]*)`+")
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+", re.M)
_QUOTE = re.compile(r"^[ \t]*>[ \t]?", re.M)
_BULLET = re.compile(r"^[ \t]*[-*+•][ \t]+", re.M)
_RULE = re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.M)
_TABLE_RULE = re.compile(r"^[ \t]*(?:\|[ \t]*)?:?-{3,}.*$", re.M)
_HTML = re.compile(r"</?[A-Za-z][^<>]*>")
# Emphasis ends at the next delimiter or not at all: ((?!\1).) never scans past another opener.
_STRONG = re.compile(r"(\*\*|__)(?=\S)((?:(?!\1).)+?)(?<=\S)\1", re.S)
_EM = re.compile(r"(?<![\w*])([*_])(?=\S)((?:(?!\1).)+?)(?<=\S)\1(?![\w*])", re.S)
_STRIKE = re.compile(r"~~(.+?)~~", re.S)
_STRAY = re.compile(r"`+|\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w)|~~|#{2,}|\|")
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f1e6-\U0001f1ff\U0000fe0f\U0000200d"
    "\U00002b00-\U00002bff\U0001fc00-\U0001ffff]"
)
# Addresses are tried once per run of address characters (from its start, past leading dots and
# dashes, which stay as they are): tried at every word start of "a.a.a…" they scan the run each time.
_DOMAIN = re.compile(
    r"(?<![\w.-])(?P<lead>[.-]*)\b(?P<addr>[\w-]+(?:\.[\w-]+)*\."
    r"(?:com|org|net|io|ai|dev|app|edu|gov|co|uk|cn|de|fr|jp|info|me|txt|pdf|json|ya?ml|py|md|csv|docx?|xlsx?|png"
    r"|jpe?g|wav|mp3|zip)\b(?:/[\w./?=&%-]*\w)?)"
)
_GLUED_DIGITS = re.compile(r"(?<=[A-Za-z])(?=\d)")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>()\"'，。！？]+[^\s<>()\"'，。！？.,;:!?]")
_EMAIL = re.compile(r"(?<![\w.+-])(?P<lead>[.+-]*)\b(?P<addr>[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b)")
_SPACES = re.compile(r"[ \t]{2,}")


def strip_markdown(text: str) -> str:
    text = _FENCE_BLOCK.sub(" ", text)
    text = _FENCE_LINE.sub("", text)  # a fence whose other half is in another segment
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _INLINE_CODE.sub(r"\1", text)
    text = _RULE.sub("", text)
    text = _TABLE_RULE.sub("", text)
    text = _HEADING.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub("", text)
    text = _HTML.sub("", text)
    text = _STRONG.sub(r"\2", text)
    text = _STRIKE.sub(r"\1", text)
    text = _EM.sub(r"\2", text)
    text = _STRAY.sub(" ", text)
    return text


def _speak_address(text: str, dot: str, at: str) -> str:
    text = re.sub(r"^(?:https?://)", "", text)
    text = text.replace("www.", "w w w" + dot)
    return text.replace(".", dot).replace("/", " slash ").replace("@", at).replace("-", " dash ")


# -- Number readings ----------------------------------------------------------------------------

# At most seven groups (10^24) so that an attempt from each group of a long run scans a bounded span.
_NUM = r"\d{1,3}(?:,\d{3}){1,7}(?:\.\d+)?|\d+(?:\.\d+)?"
# A number that must be followed by something (%, a unit) starts where its digits start: tried from
# inside a run of digits too, it would scan to the run's end from every one of them.
_LEAD_NUM = r"(?<!\d)(" + _NUM + r")"
_CURRENCY = {"$": ("dollar", "cent"), "€": ("euro", "cent"), "£": ("pound", "penny"), "¥": ("yen", "")}
_ZH_CURRENCY = {"$": "美元", "€": "欧元", "£": "英镑", "¥": "元", "￥": "元"}
_SCALE_WORDS = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "bn": "billion"}
_EN_UNITS = {
    "km": "kilometer", "kg": "kilogram", "cm": "centimeter", "mm": "millimeter", "mg": "milligram",
    "ml": "milliliter", "mph": "mile per hour", "km/h": "kilometer per hour", "kmh": "kilometer per hour",
    "°C": "degree Celsius", "°F": "degree Fahrenheit", "GB": "gigabyte", "MB": "megabyte",
    "KB": "kilobyte", "TB": "terabyte", "GHz": "gigahertz", "MHz": "megahertz", "Hz": "hertz",
    "ms": "millisecond", "kW": "kilowatt", "kWh": "kilowatt hour", "lb": "pound", "lbs": "pound",
    "ft": "foot", "oz": "ounce", "min": "minute",
}  # fmt: skip
# Not units here: "in", "h", "m", "s" — too often plain words or letters after a number.
_ZH_UNITS = {
    "km": "公里", "kg": "公斤", "cm": "厘米", "mm": "毫米", "mg": "毫克", "ml": "毫升", "km/h": "公里每小时",
    "°C": "摄氏度", "°F": "华氏度", "GB": "G", "MB": "兆", "TB": "T", "GHz": "吉赫兹", "ms": "毫秒",
    "kW": "千瓦", "kWh": "千瓦时", "min": "分钟",
}  # fmt: skip
_UNIT_RE = "|".join(re.escape(u) for u in sorted(set(_EN_UNITS) | set(_ZH_UNITS), key=len, reverse=True))
_ZH_MEASURE_TWO = set("个位种次件名条只本张台辆家口头匹双对份")


def _plural(word: str, one: bool) -> str:
    if one:
        return word
    if word.endswith("foot"):
        return word[:-4] + "feet"
    if word.endswith("inch"):
        return word + "es"
    if word.endswith("penny"):
        return word[:-5] + "pence"
    if " per " in word or word.startswith("degree "):  # miles per hour, degrees Celsius
        head, _, tail = word.partition(" ")
        return head + "s " + tail
    return word if word in ("yen", "hertz") else word + "s"


def _en_number(s: str) -> str:
    s = s.replace(",", "")
    integer, _, fraction = s.partition(".")
    return nb.en_decimal(integer, fraction) if fraction else nb.en_integer(integer)


def _zh_number(s: str) -> str:
    s = s.replace(",", "")
    integer, _, fraction = s.partition(".")
    if not fraction and len(integer) > 1 and integer.startswith("0"):
        return nb.zh_digits(integer)  # 0571, codes and phone numbers
    return nb.zh_decimal(integer, fraction) if fraction else nb.zh_integer(integer)


def _is_one(s: str) -> bool:
    return s.replace(",", "") in ("1", "1.0")


Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _en_money(m: re.Match[str]) -> str:
    unit, sub = _CURRENCY[m["cur"]]
    amount = m["amount"].replace(",", "")
    integer, _, cents = amount.partition(".")
    if m["scale"]:
        return f"{_en_number(amount)} {_SCALE_WORDS.get(m['scale'], m['scale'])} {_plural(unit, False)}"
    words = f"{nb.en_integer(integer)} {_plural(unit, integer == '1')}"
    if cents and sub and int(cents[:2].ljust(2, "0")):
        c = int(cents[:2].ljust(2, "0"))
        words += f" and {nb.en_cardinal(c)} {_plural(sub, c == 1)}"
    return words


def _en_time(m: re.Match[str]) -> str:
    words = nb.en_time(int(m["h"]), int(m["m"]))
    if m["ampm"]:
        words = words.replace(" o'clock", "") + " " + " ".join(m["ampm"].replace(".", "").lower())
    return words


def _en_date(m: re.Match[str]) -> str:
    y, mo, d = int(m["y"]), int(m["mo"]), int(m["d"])
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m[0]
    return f"{nb.MONTHS[mo - 1]} {nb.en_ordinal(d)}, {nb.en_year(y)}"


def _en_plain(m: re.Match[str]) -> str:
    s = m[0]
    if re.fullmatch(r"1[1-9]\d\d|20\d\d", s):
        return nb.en_year(int(s))  # a bare four-digit number in this range is nearly always a year
    if len(s) > 1 and s.startswith("0") and "." not in s:
        return nb.en_digits(s)
    return _en_number(s)


_EN_ABBREVIATIONS = {
    "Dr.": "Doctor", "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz", "Prof.": "Professor",
    "vs.": "versus", "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera",
    "approx.": "approximately",
}  # fmt: skip
# Glued to Han text too (例如e.g.中文, 参见Dr. Smith的): only a Latin letter, digit or dot before it binds.
_EN_ABBREVIATION_RE = re.compile(
    r"(?<![A-Za-z0-9_.])(?:" + "|".join(re.escape(a) for a in _EN_ABBREVIATIONS) + r")(?=\s|$|,|[^\x00-\x7f])"
)
_ZH_ABBREVIATIONS = {"e.g.": "例如", "i.e.": "即", "etc.": "等等", "vs.": "对", "approx.": "约"}

# -- Digits read one by one: addresses, phone and service numbers, codes ------------------------------

# An IPv4 address: four groups of at most three digits, tried only where a run of digits and dots starts.
_IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\d.]|\.\d)")
_ZH_MEASURES = "人元块个次件年月日天号位台辆家万亿千百米克岁分秒名张条只本倍度"
# A mainland mobile number; a government or carrier service line (12315, 12345, 10086, 95588).
# Not one followed by a measure word or unit: 人口12315人 is a count.
_ZH_PHONE = re.compile(
    r"(?<![\d.,])(?:1[3-9]\d{9}|123\d\d|100[18]\d|95\d{3})(?![\d%％]|[.,]\d|\s?[" + _ZH_MEASURES + r"])"
)
# Digits after a word that names a code (拨打110, 电话：12315, 房间1201, call 911), by the list that makes
# the word and its digits one atom to the segmenter (segmentation/atoms.py): no cut falls between them.
_CODE_SEP = "[" + re.escape("".join(sorted(atoms.CODE_SEPARATORS))) + "]{0,3}"
_ZH_CODE = re.compile(
    "(" + "|".join(atoms.CODE_WORDS_ZH) + ")(" + _CODE_SEP + r")(\d{3,32})(?![\d%％]|[.,]\d)"
)
_EN_CODE = re.compile(
    r"(?i:(?<![A-Za-z])(" + "|".join(map(re.escape, atoms.CODE_WORDS_EN)) + ")(" + _CODE_SEP + r"))(\d{3,32})"
    r"(?![\d%]|[.,]\d)"
)

# A decimal with no integer part (.5), where no digit, letter or dot comes before its dot.
_LEADING_DECIMAL = re.compile(r"(?<![0-9A-Za-z.])\.(\d{1,64})(?![\d.])")


_EN_RULES: list[Rule] = [
    (_EN_ABBREVIATION_RE, lambda m: _EN_ABBREVIATIONS[m[0]]),
    (_IPV4, lambda m: " dot ".join(nb.en_digits(p) for p in m[0].split("."))),
    (_EN_CODE, lambda m: m[1] + m[2] + nb.en_digits(m[3])),
    (re.compile(r"(?<![\w.])St\.(?=\s+[A-Z])"), lambda m: "Saint"),  # St. Louis; "Main St." stays
    (re.compile(r"(?<![\w.])No\.\s?(?=\d)"), lambda m: "number "),
    (re.compile(r"(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})\b"), _en_date),
    (
        re.compile(r"(?P<cur>[$€£¥])\s?(?P<amount>" + _NUM + r")(?:\s?(?P<scale>bn|[kKmM])\b)?"),
        _en_money,
    ),
    (re.compile(_LEAD_NUM + r"\s?%"), lambda m: _en_number(m[1]) + " percent"),
    (
        re.compile(r"\b(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)\b(?:\s?(?P<ampm>[aApP]\.?[mM]\.?))?"),
        _en_time,
    ),
    (
        re.compile(r"\b(\d{1,2})\s?([aApP])\.?[mM]\b\.?"),
        lambda m: f"{nb.en_cardinal(int(m[1]))} {m[2].lower()} m",
    ),
    (re.compile(r"\b(\d+)(?:st|nd|rd|th)(?![A-Za-z])"), lambda m: nb.en_ordinal_of(m[1])),  # 3rd名 too
    (
        re.compile(_LEAD_NUM + r"\s?(" + _UNIT_RE + r")(?![A-Za-z])"),
        lambda m: (
            f"{_en_number(m[1])} {_plural(_EN_UNITS[m[2]], _is_one(m[1]))}" if m[2] in _EN_UNITS else m[0]
        ),
    ),
    (re.compile(r"\b\d+(?:\.\d+){2,}\b"), lambda m: " point ".join(_en_number(p) for p in m[0].split("."))),
    (re.compile(r"(?<![\w.])-(?=\d)"), lambda m: "minus "),
    (_LEADING_DECIMAL, lambda m: "point " + nb.en_digits(m[1])),
    (re.compile(_NUM), _en_plain),
    (re.compile(r"(?<!\s)\s*&\s*|&\s*"), lambda m: " and "),  # tried once per run of spaces
    (re.compile(r"(?<=\d)\s*\+\s*(?=\d)|(?<=\s)\+(?=\s)"), lambda m: " plus "),
    (re.compile(r"\s=\s"), lambda m: " equals "),
]


def _zh_time(m: re.Match[str]) -> str:
    h, mi = int(m["h"]), int(m["m"])
    hour = "两" if h == 2 else nb.zh_cardinal(h)
    if mi == 0:
        return hour + "点"
    return hour + "点" + ("零" + nb.zh_cardinal(mi) if mi < 10 else nb.zh_cardinal(mi)) + "分"


def _zh_money(m: re.Match[str]) -> str:
    """¥24.50 → 二十四点五元; ¥1,024.50万元 → 一千零二十四点五万元 (the 元 written after it is not said
    twice); $5万 → 五万美元."""
    cur, amount, scale, yuan = m[1], m[2], m[3], m[4]
    unit = _ZH_CURRENCY[cur]
    if "." in amount:
        amount = amount.rstrip("0").rstrip(".")
    tail = "" if unit == "元" else yuan  # $5元 keeps what it says
    return _zh_number(amount) + scale + unit + tail


def _zh_plain(m: re.Match[str]) -> str:
    s, after = m[1], m[2]
    if s == "2" and after and after[0] in _ZH_MEASURE_TWO:
        return "两" + after
    if after == "元" and "." in s:
        s = s.rstrip("0").rstrip(".")  # 24.50元 → 二十四点五元
    return _zh_number(s) + after


_ZH_RULES: list[Rule] = [
    (_EN_ABBREVIATION_RE, lambda m: _ZH_ABBREVIATIONS.get(m[0], _EN_ABBREVIATIONS[m[0]])),
    (_IPV4, lambda m: "点".join(nb.zh_code(p) for p in m[0].split("."))),
    (_ZH_CODE, lambda m: m[1] + m[2] + nb.zh_code(m[3])),
    (_ZH_PHONE, lambda m: nb.zh_code(m[0])),
    (re.compile(r"(第?)(?<!\d)(\d{1,16})(?:st|nd|rd|th)(?![A-Za-z])"), lambda m: "第" + nb.zh_integer(m[2])),
    (re.compile(r"(\d{4})(?=年)"), lambda m: nb.zh_digits(m[1])),
    (
        re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})\b"),
        lambda m: f"{nb.zh_digits(m[1])}年{nb.zh_cardinal(int(m[2]))}月{nb.zh_cardinal(int(m[3]))}日",
    ),
    (re.compile(r"([$€£¥￥])\s?(" + _NUM + r")([万亿]?)(元?)"), _zh_money),
    (re.compile(_LEAD_NUM + r"\s?[%％]"), lambda m: "百分之" + _zh_number(m[1])),
    (re.compile(r"(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?!\d)"), _zh_time),
    (
        re.compile(_LEAD_NUM + r"\s?(" + _UNIT_RE + r")(?![A-Za-z])"),
        lambda m: _zh_number(m[1]) + _ZH_UNITS[m[2]] if m[2] in _ZH_UNITS else m[0],
    ),
    (re.compile(r"(?<!\d)\d+(?:\.\d+){2,}"), lambda m: "点".join(_zh_number(p) for p in m[0].split("."))),
    (re.compile(r"(?<![\w.])-(?=\d)"), lambda m: "负"),
    (_LEADING_DECIMAL, lambda m: "零点" + nb.zh_digits(m[1])),
    (re.compile(r"(" + _NUM + r")(\S?)"), _zh_plain),
    (re.compile(r"(?<!\s)\s*[&＆]\s*|[&＆]\s*"), lambda m: "和"),
    (re.compile(r"(?<=\d)\s*\+\s*(?=\d)"), lambda m: "加"),
]


def _apply(rules: list[Rule], text: str) -> str:
    for pattern, fn in rules:
        text = pattern.sub(fn, text)
    return text


def speech_language(text: str, language: str = "auto") -> str:
    """'zh' or 'en' for reading numbers: the caller's choice, or the text's majority script."""
    lang = language.lower()
    if lang.startswith(("zh", "cmn", "chinese", "mandarin")):
        return "zh"
    if lang != "auto":
        return "en"
    n_han, n_words = _script_counts(text)
    return "zh" if n_han and n_han >= n_words else "en"


def _script_counts(text: str) -> tuple[int, int]:
    """(Han characters, Latin words that are not just digits) in `text`."""
    return len(HAN_RE.findall(text)), sum(1 for w in LATIN_WORD_RE.findall(text) if not w.isdigit())


class UtteranceLanguage:
    """The reading language of an utterance's segments, decided from the utterance, not from each
    segment alone. Under `auto`, a segment with Han characters or Latin words is read by its own
    majority script (a Mandarin reply may quote an English sentence); a segment with neither ("12.5%。",
    "- 08:30", "2026-05-01") is read in the language of the utterance so far, by the majority of the
    scripts of all its segments (counted once each, so the cost is linear). A named language is kept."""

    def __init__(self) -> None:
        self.han = 0  # Han characters in the utterance's segments so far
        self.words = 0  # Latin words (not bare numbers) in them

    def of(self, text: str, language: str = "auto") -> str:
        """The language `text`, the utterance's next segment, is read in ('zh', 'en', or `language`)."""
        if language.lower() != "auto":
            return language
        n_han, n_words = _script_counts(text)
        self.han += n_han
        self.words += n_words
        if n_han or n_words:
            return "zh" if n_han >= n_words else "en"
        if self.han or self.words:
            return "zh" if self.han >= self.words else "en"
        return "auto"


def normalize_for_speech(text: str, language: str = "auto") -> str:
    check_text(text)
    text = strip_markdown(text)
    text = _EMOJI.sub("", text)
    lang = speech_language(text, language)
    dot, at = " dot ", " at "
    text = _URL.sub(lambda m: _speak_address(m[0], dot, at), text)
    text = _EMAIL.sub(lambda m: m["lead"] + _speak_address(m["addr"], dot, at), text)
    text = _DOMAIN.sub(lambda m: m["lead"] + _speak_address(m["addr"], dot, at), text)
    text = _GLUED_DIGITS.sub(" ", text)  # v2 → v 2, MP3 → MP 3
    text = _apply(_ZH_RULES if lang == "zh" else _EN_RULES, text)
    text = _SPACES.sub(" ", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()
