"""What the listener has not heard yet, across a connection's utterances: committed text whose audio has
not begun, audio sent but not yet played at real time, and (one file per utterance) audio made but held
for a file not yet sent. Past any bound, `input.text` is refused (`backlog_full`) rather than held in
memory without bound; the reader is never paused instead, since a paused reader would hold back a
barge-in."""

from __future__ import annotations

from gateway.playback import Playback
from gateway.protocol import ProtocolError, quote
from gateway.settings import Limits
from gateway.utterance import Utterance


class Backlog:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.chars = 0  # committed characters whose audio has not begun, every utterance
        self.listener = Playback(count_underruns=False)  # the client's player, across utterances
        self.file_s = 0.0  # seconds of audio held for files not yet sent, every utterance

    def admit(self, utt: Utterance, text: str) -> None:
        """Refuse text past the utterance's length bound or the backlog ahead of the listener: an
        explicit refusal naming what was not taken."""
        lim, n = self.limits, len(text)

        def refused() -> str:  # its words made only for a refusal: admit runs for every piece of text
            return f"{n} characters of input.text ({quote(text, 40)}) were not accepted"

        if utt.chars + n > lim.max_utterance_chars:
            raise ProtocolError(
                "utterance_too_long",
                f"{refused()}: an utterance holds at most {lim.max_utterance_chars} characters; send input.done",
                utterance_index=utt.index, rejected_chars=n,
            )  # fmt: skip
        # What is already pending decides, so one big message is taken whole (it is bounded by the
        # message limit) and the backlog never exceeds the bound by more than one message.
        # The audio ahead is its listener's (a context's own where contexts interleave: each is heard apart).
        pending, listener = self.chars + utt.segmenter.pending_chars, utt.listener or self.listener
        if pending > lim.max_backlog_chars or listener.ahead_s() > lim.max_audio_ahead_s:
            raise ProtocolError(
                "backlog_full",
                f"{refused()}: the listener is too far behind ({pending} characters not yet spoken, "
                f"{listener.ahead_s():.0f} s of audio not yet played); send it again later",
                utterance_index=utt.index, rejected_chars=n,
            )  # fmt: skip
        if self.file_s >= lim.max_file_audio_s:
            raise ProtocolError(
                "backlog_full",
                f"{refused()}: {self.file_s:.0f} s of audio are held for a file not yet sent (max_file_audio_s "
                f"{lim.max_file_audio_s:g} s); send it again once that file has come",
                utterance_index=utt.index, rejected_chars=n, bound="max_file_audio_s",
            )  # fmt: skip

    def held(self, utt: Utterance, seconds: float) -> None:
        """Audio made for `utt`'s file, held until the file is sent."""
        utt.file_s += seconds
        self.file_s += seconds

    def file_sent(self, utt: Utterance) -> None:
        """`utt`'s file has gone to the socket (or never will): its audio is no longer held."""
        self.file_s = max(0.0, self.file_s - utt.file_s)
        utt.file_s = 0.0

    def committed(self, utt: Utterance, segment: int, chars: int) -> None:
        """A segment went to the engine: it is in the backlog until its audio begins."""
        utt.unheard[segment] = chars
        self.chars += chars

    def heard(self, utt: Utterance, segment: int) -> None:
        """A segment's audio has begun: it leaves the backlog."""
        utt.marked.add(segment)
        self.chars -= utt.unheard.pop(segment, 0)

    def forget(self, utt: Utterance) -> None:
        """The utterance is over: what of it was never heard leaves the backlog."""
        self.chars -= sum(utt.unheard.values())
        utt.unheard.clear()
        self.file_sent(utt)
