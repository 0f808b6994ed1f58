"""Re-implementations of the peers' published splitting rules, behind one streaming interface.

Each `feed(delta)` returns the source offsets where units were committed (a unit ends there); the
benchmark compares those offsets with the corpus. Written from the peers' documented behaviour
(../shared/research/vllm_omni_spec.md §2, agent_tts_anchors.md §3), not copied from their code.
"""

from __future__ import annotations

import re

from segmentation import StreamSegmenter


class Ours:
    """A Mandarin cut at a word (reason `word`: a long run with no mark, in pieces as it streams) is an
    extra commit inside a clause, not a sentence or clause decision: it is left out here, as the corpus
    tests count it apart (tests/segmentation/test_run_cut.py)."""

    def __init__(self, granularity: str) -> None:
        self.seg = StreamSegmenter(granularity=granularity)

    def feed(self, delta: str) -> list[int]:
        return [s.end for s in self.seg.feed(delta) if s.reason != "word"]

    def flush(self) -> list[int]:
        return [s.end for s in self.seg.flush()]


class VllmOmni:
    """vLLM-Omni's splitter: `.!?` end a unit once whitespace follows; `。！？…` (and `，；` plus
    `,;` in clause mode) end it at once; a `.` between two digits is skipped."""

    LATIN = ".!?"
    SCRIPT = "。！？…"

    def __init__(self, granularity: str) -> None:
        self.clause = ",;，；" if granularity == "clause" else ""
        self.buf = ""
        self.base = 0

    def _extract(self) -> list[int]:
        out, last, buf = [], 0, self.buf
        i = 0
        while i < len(buf):
            c = buf[i]
            if c == "." and 0 < i < len(buf) - 1 and buf[i - 1].isdigit() and buf[i + 1].isdigit():
                i += 1
                continue
            if c in self.LATIN or c in self.SCRIPT or c in self.clause:
                j = i + 1
                while j < len(buf) and buf[j].isspace():
                    j += 1
                if c in self.LATIN and j == i + 1:
                    if j == len(buf):
                        break  # wait for what follows
                    i += 1
                    continue
                out.append(self.base + j)
                last = i = j
                continue
            i += 1
        self.buf, self.base = buf[last:], self.base + last
        return out

    def feed(self, delta: str) -> list[int]:
        self.buf += delta
        return self._extract()

    def flush(self) -> list[int]:
        end = self.base + len(self.buf)
        self.buf, self.base = "", end
        return [end]


class LiveKitBasic:
    """LiveKit's basic sentence tokenizer: regex rules (titles, acronyms, websites, digits), run over
    the buffer each push; all sentences but the last are emitted, shorter ones than 20 characters
    merged into the next."""

    MIN_LEN = 20
    _prefixes = re.compile(r"(Mr|St|Mrs|Ms|Dr)[.]")
    _websites = re.compile(r"[.](com|net|org|io|gov|edu|me)")
    _digits = re.compile(r"([0-9])[.]([0-9])")
    _acronym3 = re.compile(r"\b([A-Z])[.]([A-Z])[.]([A-Z])[.]")
    _acronym2 = re.compile(r"\b([A-Z])[.]([A-Z])[.]")
    _single = re.compile(r"\s([A-Za-z])[.] ")
    _dots = re.compile(r"\.{2,}")

    def __init__(self, granularity: str = "sentence") -> None:
        self.buf = ""
        self.base = 0

    def _sentence_ends(self, text: str) -> list[int]:
        # Mark protected periods with a same-length placeholder so offsets stay valid.
        t = self._prefixes.sub(lambda m: m[1] + "\0", text)
        t = self._websites.sub(lambda m: "\0" + m[1], t)
        t = self._digits.sub(lambda m: m[1] + "\0" + m[2], t)
        t = self._acronym3.sub(lambda m: f"{m[1]}\0{m[2]}\0{m[3]}\0", t)
        t = self._acronym2.sub(lambda m: f"{m[1]}\0{m[2]}\0", t)
        t = self._single.sub(lambda m: f" {m[1]}\0 ", t)
        t = self._dots.sub(lambda m: "\0" * len(m[0]), t)
        ends = []
        for m in re.finditer(r"[.!?。！？]+[\"”')\]」』]*\s*", t):
            ends.append(m.end())
        return ends

    def feed(self, delta: str) -> list[int]:
        self.buf += delta
        ends = [e for e in self._sentence_ends(self.buf) if e < len(self.buf)]
        out, last = [], 0
        for e in ends:
            if e - last >= self.MIN_LEN:
                out.append(self.base + e)
                last = e
        self.buf, self.base = self.buf[last:], self.base + last
        return out

    def flush(self) -> list[int]:
        end = self.base + len(self.buf)
        self.buf, self.base = "", end
        return [end]


class PipecatLookahead:
    """Pipecat-style: a terminator followed by one more character ends the sentence, unless a
    short look-behind list (titles, a capital letter, a digit) says otherwise."""

    _end = re.compile(r"(?<![A-Z])(?<!\d)(?<!\d\s[ap])(?<!Mr|Ms|Dr)(?<!Mrs)(?<!Prof)[.?!]|[。？！]")

    def __init__(self, granularity: str = "sentence") -> None:
        self.buf = ""
        self.base = 0

    def feed(self, delta: str) -> list[int]:
        self.buf += delta
        out = []
        while True:
            m = self._end.search(self.buf)
            if not m or m.end() >= len(self.buf):
                break
            j = m.end()
            while j < len(self.buf) and self.buf[j].isspace():
                j += 1
            if j == len(self.buf):
                break
            out.append(self.base + j)
            self.buf, self.base = self.buf[j:], self.base + j
        return out

    def flush(self) -> list[int]:
        end = self.base + len(self.buf)
        self.buf, self.base = "", end
        return [end]


SEGMENTERS = {
    "voxgate/sentence": lambda: Ours("sentence"),
    "voxgate/clause": lambda: Ours("clause"),
    "voxgate/auto": lambda: Ours("auto"),
    "vllm-omni/sentence": lambda: VllmOmni("sentence"),
    "vllm-omni/clause": lambda: VllmOmni("clause"),
    "livekit-basic": LiveKitBasic,
    "pipecat-lookahead": PipecatLookahead,
}
