"""The text side of the Qwen3 engine core: which pending text a request takes, how many tokens fit, what
the talker consumed and what goes back, and how many frames text is expected to take. It needs the
tokenizer, never a tensor, so it is tested without the core thread (tests/engine/test_text_track.py).

Text reaches a stream as appended pieces, one segment each. A piece's trailing whitespace is held back
(`carry`) and put before the next piece, where Qwen's BPE expects it (" world", not "hello " + "world").
No committed text is lost: a request takes whole pieces while they fit its token budget (a piece alone
larger than the budget is cut at a word boundary), and what the model did not consume (it said EOS
early) goes back in front of the pending text.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from engine.options import quote_text
from engine.qwen3.serving.core_stream import ClonedVoice, CoreStream, TalkerRequest


class Tokenizer(Protocol):
    """What the text track uses of `engine.qwen3.text.TextTokenizer`."""

    tok: _Offsets

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def content_ids(self, text: str) -> list[int]: ...


class _Encoding(Protocol):
    offsets: list[tuple[int, int]]


class _Offsets(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> _Encoding: ...


@dataclass(frozen=True, slots=True)
class TrackLimits:
    max_context: int  # KV positions per slot: prompt + frames
    min_frames: int  # frames a request may make beyond its text's share
    frames_per_token: float  # frame cap per text row (real speech: ~2–4)
    hold_more_frames: float  # frames counted for text still to come (the first-audio hold)


class Pace:
    """Frames per text row, measured from requests the model ended by EOS: none until `min_requests`
    are, then an EWMA of weight `alpha`. What a stream's text is expected to take (the first-audio hold)."""

    def __init__(self, min_requests: int = 3, alpha: float = 0.2) -> None:
        self.min_requests, self.alpha = min_requests, alpha
        self.frames_per_row: float | None = None
        self._seen = 0

    def observe(self, talk: TalkerRequest) -> None:
        if not talk.ended_by_eos or talk.rows <= 0 or talk.frames <= 0:
            return
        ratio = talk.frames / talk.rows
        self._seen += 1
        if self.frames_per_row is None:
            if self._seen >= self.min_requests:
                self.frames_per_row = ratio
            return
        self.frames_per_row += self.alpha * (ratio - self.frames_per_row)


class TextTrack:
    """The text rules of every stream of one core. `prompt_rows(stream)`: the rows of the stream's prompts
    (the model builds them; the voice decides their length)."""

    def __init__(self, tokenizer: Tokenizer, limits: TrackLimits, prompt_rows: Callable[[CoreStream], int]) -> None:
        self.tokenizer, self.limits, self.prompt_rows = tokenizer, limits, prompt_rows

    def piece_ids(self, carry: str, text: str) -> tuple[list[int], str]:
        """Token ids of one appended piece, and the new carry."""
        stripped = text.rstrip()
        if not stripped:
            return [], carry + text
        return self.tokenizer.encode(carry + stripped), text[len(stripped):]

    @staticmethod
    def has_pending(stream: CoreStream) -> bool:
        return any(text.strip() for _, text in stream.pending_text)

    @staticmethod
    def ref_overflow(stream: CoreStream) -> int:
        """Transcript tokens of an ICL clone beyond its reference frames: they ride the text track."""
        if not stream.icl:
            return 0
        assert isinstance(stream.voice, ClonedVoice) and stream.voice.clone.ref_codes is not None
        return max(0, len(stream.voice.ref_ids) - stream.voice.clone.ref_codes.shape[0] - 1)

    def budget(self, stream: CoreStream) -> int:
        """Content tokens one request may take: its frame cap for them (min_frames + frames_per_token per
        track row) must fit the slot's KV positions after the prompt, so the cap never cuts text."""
        lim = self.limits
        room = lim.max_context - self.prompt_rows(stream) - lim.min_frames
        return math.floor(room / lim.frames_per_token) - self.ref_overflow(stream)

    def frame_cap(self, talk: TalkerRequest) -> int:
        """Frames a request may make: from its text length (a model that never emits EOS must stop), and
        never past its slot's KV positions (`budget` keeps the first below the second)."""
        lim = self.limits
        return min(lim.min_frames + math.ceil(lim.frames_per_token * talk.rows), lim.max_context - talk.prompt_len)

    def can_admit(self, stream: CoreStream) -> bool:
        """A prompt can be built from the pending text, and the voice is ready. An ICL clone's prompt sums
        the text track (transcript ++ text) with the reference frames row by row, so before `finish()` it
        waits until the text covers them (or fills a whole request): then later text only extends the
        trailing queue, exactly as if the whole text had come at once."""
        if stream.ended or stream.talk is not None or isinstance(stream.voice, Future) \
                or not self.has_pending(stream):
            return False
        if stream.finished or not stream.icl:
            return True
        try:
            assert isinstance(stream.voice, ClonedVoice) and stream.voice.clone.ref_codes is not None
            cover = stream.voice.clone.ref_codes.shape[0] + 1 - len(stream.voice.ref_ids)
            enough = min(cover, self.budget(stream))
            return enough <= 0 or self.pending_tokens(stream, enough) >= enough
        except Exception:  # admission meets the same failure and ends the stream with it
            return True

    def pending_tokens(self, stream: CoreStream, enough: int) -> int:
        """Content tokens of the pending text, counted until `enough`."""
        n, carry, first = 0, "", True
        for _, text in stream.pending_text:
            stripped = text.rstrip()
            if not stripped:
                carry += text
                continue
            n += len(self.tokenizer.content_ids(stripped) if first else self.piece_ids(carry, text)[0])
            first, carry = False, text[len(stripped):]
            if n >= enough:
                break
        return n

    def take(self, stream: CoreStream, budget: int) -> tuple[list[int], list[int]]:
        """The pending pieces one request speaks: whole pieces while they fit `budget` tokens (a piece alone
        larger is cut at a word boundary, its rest left pending) → (content ids, segment of each). The first
        piece is tokenized as the prompt's text; each later one with the carry of the piece before it."""
        ids: list[int] = []
        segments: list[int] = []
        pending, ledger = stream.pending_text, stream.ledger
        carry = ""
        while pending:
            seg, text = pending[0]
            stripped = text.rstrip()
            if not stripped:
                carry += text
                ledger.taken += len(text)
                pending.popleft()
                continue
            piece = self.tokenizer.content_ids(stripped) if not ids else self.piece_ids(carry, text)[0]
            if len(ids) + len(piece) > budget:
                if ids:
                    break  # the next request takes it
                head, tail = self.cut(stripped, budget)
                pending[0] = (seg, tail + text[len(stripped):])
                ledger.taken += len(text) - len(pending[0][1])
                piece = self.tokenizer.content_ids(head)
                ids, segments, carry = piece, [seg] * len(piece), ""
                break
            ids += piece
            segments += [seg] * len(piece)
            carry = text[len(stripped):]
            ledger.taken += len(text)
            pending.popleft()
        stream.carry = carry
        return ids, segments

    def cut(self, text: str, budget: int) -> tuple[str, str]:
        """`text` (longer than `budget` tokens) → a head of at most `budget` tokens, ending at a word
        boundary where there is one, and the rest."""
        starts = [a for a, _ in self.tokenizer.tok.encode(text, add_special_tokens=False).offsets]
        k = min(budget, len(starts) - 1)  # the head is tokens [0, k)
        while k > 0:
            # A token next to whitespace starts a word; CJK text has none: cut between tokens then.
            words = [c for c in range(k, 0, -1) if text[starts[c] - 1].isspace() or text[starts[c]].isspace()]
            cut = words[0] if words else k
            head, tail = text[:starts[cut]].rstrip(), text[starts[cut]:].lstrip()
            if head and len(self.tokenizer.content_ids(head)) <= budget:
                return head, tail
            k = cut - 1
        raise ValueError(f"cannot cut {len(text)} characters into pieces of {budget} tokens")

    @staticmethod
    def consumed(talk: TalkerRequest) -> int:
        """Content tokens of a request the talker has consumed (the prompt's included)."""
        rows = talk.frames if talk.ended_by_eos else max(talk.frames - 1, 0)  # text rows fed to a step
        return max(0, min(rows + talk.track_offset, len(talk.ids)))

    def account(self, stream: CoreStream) -> int:
        """Count the content tokens the stream's request consumed; put those it did not (the model said EOS
        before reaching them) back in front of the pending text. Returns the tokens consumed."""
        talk = stream.talk
        assert talk is not None
        k = self.consumed(talk)
        new = {s for s in talk.token_segments[:k] if s > stream.fed_last}
        stream.fed_tokens += k
        stream.fed_segments += len(new)
        stream.fed_last = max(new, default=stream.fed_last)
        if k in (0, len(talk.ids)):
            return k
        groups: list[tuple[int, list[int]]] = []
        for seg, tok in zip(talk.token_segments[k:], talk.ids[k:], strict=True):
            if groups and groups[-1][0] == seg:
                groups[-1][1].append(tok)
            else:
                groups.append((seg, [tok]))
        # A space after each: it becomes the carry before the piece that follows, as appended text has.
        back = [(seg, self.tokenizer.decode(ids) + " ") for seg, ids in groups]
        stream.pending_text.extendleft(reversed(back))
        stream.ledger.taken -= sum(len(text) for _, text in back)
        return k

    def unspoken(self, stream: CoreStream) -> str:
        """The committed text a failing stream leaves unspoken (for its error message)."""
        with contextlib.suppress(Exception):
            talk = stream.talk
            taken = ""
            if talk is not None and talk.ids:
                start = self.consumed(talk) if talk.frames else 0  # no frame yet: none of it was voiced
                taken = self.tokenizer.decode(talk.ids[start:])
            return quote_text(taken + "".join(text for _, text in stream.pending_text))
        return "(unknown)"

    def frames_left(self, stream: CoreStream, frames_per_row: float | None) -> float:
        """Frames the stream's known text is expected to take past those made: its request's text rows at
        `frames_per_row` (unmeasured: one, the least a row takes, as the talker reads one a frame; a fresh
        server's hold is never longer than its text surely needs), at most the frame cap, and
        `hold_more_frames` for text still to come (not finished, or pending for a next request)."""
        talk = stream.talk
        assert talk is not None
        expected = (frames_per_row if frames_per_row is not None else 1.0) * talk.rows
        left = max(0.0, min(expected, self.frame_cap(talk)) - talk.frames)
        if not stream.finished or self.has_pending(stream):
            left += self.limits.hold_more_frames
        return left

