"""Atoms: spans whose reading depends on their neighbours, which no cut may split.

A voice reads "12.5%" as one number, "2026年" as a year (二零二六), "08:30" as a time, "25 kg" as a
quantity, "e.g." as "for example" and "127.0.0.1" as an address; cut anywhere inside, each piece is
normalised alone and read as something else ("十二." then "five percent"), and audio has no undo. So
every cut the segmenter makes (sentence, clause, first piece, Mandarin word, forced, idle) asks
`splits_atom` first; an idle commit whose tail ends inside an atom commits only the text before it
(`safe_end`) and holds the atom until more text, the flush, or the atom's end.

An atom is decided from the characters around a cut only (two before it, two after), so the answer
costs O(1) and never depends on how the text was chopped: the caller says how far text has arrived
(`hi`), and a character at or past `hi` is unknown, that is, anything may still come. The pairs that
bind, with `|` the cut:

- within a Latin token of letters and digits (`20|26`, `v|2`), and a number's connector between
  digits or letters (`12|.5`, `12.|5`, `08|:30`, `1|,000`, `e.|g`, `2026-|05`);
- a number and what reads it (`2026|年`, `4|公里`, `12|%`, `25 |kg`, `5°|C`), a sign or currency and
  its number (`$|5`, `-|3`, `¥|5`), and an ordinal's `第|3`;
- at the end of the text, with more to come: a number's trailing connector (`12.`, `08:`, `1,`,
  `2026-`), a number and a space (`25 `: a unit may follow), a single letter and a dot (`e.`, `e.g.`,
  `p.`: an initialism may go on), and a token with a digit and a dot (`v2.`).

The longest span `safe_end` looks back over is `ATOM_MAX` characters: a longer run of bound
characters (a 64-digit run, a dotted chain) is not one reading unit, and is cut as a word would be;
nothing is held past it. The forced cut still bounds every segment at `max_chars` whatever binds.
"""

from __future__ import annotations

from segmentation.chars import CLOSERS, DASH, HAN_CLAUSE_MARKS, LATIN_CLAUSE_MARKS, is_han

# How far back an idle commit looks for an atom's start: past this, the run is not one reading unit.
ATOM_MAX = 64

# Joins the digits (or letters) on both sides into one token: 12.5, 08:30, 1,000, 2026-05-01, 1/2, e.g.
CONNECTORS = frozenset(".,:/-'’")
# Read with the number they precede: currency, sign.
PREFIXES = frozenset("$€£¥￥+-−")
# Read with the number they follow, glued to it: percent, degrees.
SUFFIXES = frozenset("%％°‰")
# Han characters that read the number after them: 第3 (an ordinal; 3rd after it is read with it).
HAN_PREFIXES = frozenset("第")
# Words after which digits are a code, read one by one (拨打110, 电话：12315, call 911): the word and the
# digits are one atom, with at most `_CODE_GAP` of `CODE_SEPARATORS` between them. The normaliser reads
# by the same list (segmentation/normalize.py), so a cut between them would change the reading.
CODE_WORDS_ZH = (
    "拨打 致电 热线 电话 号码 编号 单号 工号 验证码 尾号 账号 卡号 分机 房间 房号 邮编 密码 车次 端口"
).split()
CODE_WORDS_EN = "call dial text phone extension ext. pin code room port".split()
CODE_SEPARATORS = frozenset("是为：: ")
_CODE_GAP = 3
_CODE_LONGEST = max(len(w) for w in CODE_WORDS_ZH + CODE_WORDS_EN)
_CODE_ENDS = frozenset(CODE_WORDS_ZH) | frozenset(CODE_WORDS_EN)
_SPACES = frozenset(" \t\u00a0\u3000")
_WS = frozenset(" \t\r\n\f\v\u3000\u00a0")
_TERMINATORS = frozenset(".!?。！？…")


def _alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _letter(c: str) -> bool:
    return c.isascii() and c.isalpha()


def splits_atom(buf: str, j: int, hi: int | None = None) -> bool:
    """Would a cut at `j` (between buf[j-1] and buf[j]) split an atom? Characters at or past `hi`
    (default: the end of `buf`) have not arrived: anything may still come there."""
    if hi is None:
        hi = len(buf)
    z = buf[j - 2] if j >= 2 else " "
    a = buf[j - 1] if j >= 1 else " "
    if _code_gap(buf, j, hi):
        return True  # 拨打|110, 电话：|12315, call |911
    if j >= hi:
        return _open_at_end(buf, j, z, a)
    b = buf[j]
    c = buf[j + 1] if j + 1 < hi else None  # None: not arrived yet
    if a == "." and _digit(b):
        return True  # .|5 (a decimal with no integer part, or 12.|5)
    if _alnum(a) and _alnum(b):
        return True  # 20|26, v|2, 3|rd
    if _alnum(a) and b in CONNECTORS:
        return c is None or _alnum(c)  # 12|.5, 08|:30, e|.g
    if a in CONNECTORS and _alnum(z) and _alnum(b):
        return True  # 12.|5, 08:|30, e.|g
    if _digit(a) and (is_han(b) or b in SUFFIXES):
        return True  # 2026|年, 4|公里, 12|%
    if a in SUFFIXES and _letter(b):
        return True  # 5°|C
    if a in _SPACES and _digit(z) and (_letter(b) or is_han(b) or b in SUFFIXES):
        return True  # 25 |kg, 3 |p.m., 25 |公里
    return (a in PREFIXES or a in HAN_PREFIXES) and _digit(b)  # $|5, -|3, 第|3


def _open_at_end(buf: str, j: int, z: str, a: str) -> bool:
    """Is the text up to `j` (its end so far) inside an atom that the next characters may continue?"""
    if _alnum(a) or a in PREFIXES or a in HAN_PREFIXES or a in SUFFIXES:
        return True  # 12|, $|, 第|, 5°| (a unit may follow)
    if a in _SPACES:
        return _digit(z)  # 25 | (kg may follow)
    if a in CONNECTORS and _digit(z):
        return True  # 12.| 08:| 1,| 2026-|
    if a == "." and (z in _WS or is_han(z) or "\u3000" <= z <= "\u303f" or z in ":：（(" or j == 1):
        return True  # " .|" "。.|" (.5 may follow); not "..." nor "you."
    if a == "." and _letter(z):
        y = buf[j - 3] if j >= 3 else " "
        if not _alnum(y):
            return True  # e.| p.| (e.g., p.m. may follow)
        return _has_digit_before(buf, j - 1)  # v2.| (v2.1 may follow); "you." is a word's end
    return False


def _code_gap(buf: str, j: int, hi: int) -> bool:
    """Does `j` lie between a code word and the digits after it (or text not yet arrived)? The word ends at
    most `_CODE_GAP` separators before `j`, and at most that many separators lie from `j` to a digit."""
    k = j
    while k < hi and k - j <= _CODE_GAP and buf[k] in CODE_SEPARATORS:
        k += 1
    if k < hi and not _digit(buf[k]):
        return False
    i = j
    while i > 0 and j - i < _CODE_GAP and buf[i - 1] in CODE_SEPARATORS:
        i -= 1
    if i == 0 or k - i > _CODE_GAP or not (is_han(buf[i - 1]) or _letter(buf[i - 1]) or buf[i - 1] == "."):
        return False
    for n in range(2, _CODE_LONGEST + 1):
        if n <= i and buf[i - n : i].lower() in _CODE_ENDS:
            w = buf[i - n : i]
            before = buf[i - n - 1] if i - n >= 1 else " "
            return is_han(w[0]) or not _letter(before)  # "recall 5" is no code word
    return False


def _has_digit_before(buf: str, end: int) -> bool:
    """Does the Latin token ending at `end` hold a digit? Looks back at most ATOM_MAX characters."""
    i = end - 1
    while i >= 0 and end - i <= ATOM_MAX and (_alnum(buf[i]) or buf[i] in CONNECTORS):
        if _digit(buf[i]):
            return True
        i -= 1
    return False


def _boundary(buf: str, j: int) -> bool:
    """May a piece end at `j` as far as words go: after a space or a mark, or where Han meets other text
    (率|12, 12年|底 is decided by jieba elsewhere)."""
    a, b = buf[j - 1], buf[j] if j < len(buf) else " "
    if a in _WS or a in _TERMINATORS or a in CLOSERS or a == DASH:
        return True
    if a in HAN_CLAUSE_MARKS or a in LATIN_CLAUSE_MARKS:
        return True
    return is_han(a) != is_han(b) and b not in _WS


def safe_end(buf: str, start: int, end: int) -> int:
    """The last cut at or before `end` (text has arrived up to `end`, more may come) that splits no
    atom and falls at a word boundary, after `start`; `start` if there is none. An atom longer than
    `ATOM_MAX` is no atom: `end` is returned as it is."""
    if not splits_atom(buf, end, end):
        return end
    j = end - 1
    while j > start and end - j <= ATOM_MAX:
        if not splits_atom(buf, j, end) and _boundary(buf, j):
            return j
        j -= 1
    return start if j <= start else end
