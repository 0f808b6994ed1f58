"""ElevenLabs' streaming protocol (docs/elevenlabs.md): `/v1/text-to-speech/{voice_id}/stream-input` (one
context), `…/multi-stream-input` (several, by `context_id`), over the native Connection (bridge.py).

Alignment is built from the engine's word times (`audio.words`), a word's characters spread evenly over
its span and a space between words, and cut to each audio message. Its two fields differ in their clock,
because the two frameworks that read them do: `alignment` is relative to its own message and spans exactly
that message's audio (Pipecat advances its clock by each message's last start + duration), while
`normalizedAlignment` is on the context's clock (LiveKit concatenates them without an offset).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from msgspec import UNSET, UnsetType

from gateway.audio import MP3_RATES, Mp3Stream, mp3_available
from gateway.protocol import (
    CLOSE_POLICY,
    AudioCancelled,
    AudioDone,
    AudioStart,
    AudioWords,
    ConfigMessage,
    ContextId,
    Error,
    Event,
    ProtocolError,
    SegmentCommitted,
    SessionDone,
    WordTime,
    quote,
)
from gateway.protocols.bridge import Contexts, Marker, SendText, close_socket, context_of
from gateway.protocols.bridge import decode as bridge_decode

PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
_FORMAT = re.compile(r"(pcm|ulaw|alaw|mp3)_(\d{4,5})(?:_(\d{2,3}))?")


@dataclass(frozen=True)
class OutputFormat:
    name: str  # as the client sent it ("mp3_22050_32")
    native: str  # the session's response_format: pcm, ulaw or alaw (mp3 is encoded from pcm here)
    rate: int
    mp3_kbps: int | None = None

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.native == "pcm" else 1

    @property
    def media_type(self) -> str:
        return {"pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}[self.native] \
            if self.mp3_kbps is None else "audio/mpeg"  # fmt: skip


def output_format(name: str | None) -> OutputFormat:
    """ElevenLabs' `output_format` (default mp3_44100_128, as theirs) → what voxgate streams; unsupported
    ones are refused (`unsupported_format`), never served as something else."""
    name = name or "mp3_44100_128"
    m = _FORMAT.fullmatch(name)
    if m is None:
        raise ProtocolError("unsupported_format", f"output_format {quote(name)} is not one voxgate streams")
    kind, rate, kbps = m.group(1), int(m.group(2)), m.group(3)
    if kind == "pcm" and rate in PCM_RATES and kbps is None:
        return OutputFormat(name, "pcm", rate)
    if kind in ("ulaw", "alaw") and rate == 8000 and kbps is None:
        return OutputFormat(name, kind, rate)
    if kind == "mp3" and kbps is not None and rate in MP3_RATES and 8 <= int(kbps) <= 320:
        if not mp3_available():
            raise ProtocolError("unsupported_format", "mp3 output needs lameenc (pip install 'voxgate[cpu]')")
        return OutputFormat(name, "pcm", rate, int(kbps))
    raise ProtocolError("unsupported_format", f"output_format {quote(name)} is not one voxgate streams")


def session_config(voice_id: str, fmt: OutputFormat, language: str | None) -> ConfigMessage:  # type: ignore[valid-type]
    """The native session.config a provider socket starts with: word timings on (alignment needs them)."""
    return ConfigMessage(voice=voice_id, response_format=fmt.native, sample_rate=fmt.rate,  # type: ignore[operator]
                         language=language or "auto", word_timestamps=True, timestamps_format="voxgate")  # fmt: skip


# -- messages, both ways ----------------------------------------------------------------------------


class ElevenLabsInput(msgspec.Struct, forbid_unknown_fields=False):
    """A client message. Fields with no voxgate meaning (voice_settings, generation_config,
    try_trigger_generation, pronunciation_dictionary_locators, xi_api_key, …) are accepted and ignored."""

    text: str | None = None
    context_id: ContextId | None = None
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False


class Alignment(msgspec.Struct, rename="camel"):
    chars: list[str]
    char_start_times_ms: list[int]
    char_durations_ms: list[int]


class AudioOut(msgspec.Struct, rename="camel", omit_defaults=True):
    audio: str | None = None
    alignment: Alignment | None = None
    normalized_alignment: Alignment | None = None
    context_id: str | UnsetType = UNSET


class FinalOut(msgspec.Struct, rename="camel", omit_defaults=True):
    is_final: bool  # always true (no default: omit_defaults would leave it out)
    context_id: str | UnsetType = UNSET


class ErrorOut(msgspec.Struct, rename="camel", omit_defaults=True):
    """ElevenLabs' error message shape; `error` is voxgate's stable code, `code` the close code it implies."""

    message: str
    error: str
    code: int  # no default: omit_defaults would leave it out
    context_id: str | UnsetType = UNSET


_decoder = msgspec.json.Decoder(ElevenLabsInput)
_encoder = msgspec.json.Encoder()


def decode(raw: str) -> ElevenLabsInput:
    return bridge_decode(_decoder, raw)


def error_message(code: str, message: str, context_id: str | None = None, close_code: int = CLOSE_POLICY) -> str:
    cid: str | UnsetType = UNSET if context_id is None else context_id
    return _encoder.encode(ErrorOut(message=message, error=code, code=close_code, context_id=cid)).decode()


# -- alignment --------------------------------------------------------------------------------------


@dataclass
class CharTimeline:
    """An utterance's characters on its audio clock (ms), `taken` of them sent so far: the text of its
    committed segments as the client wrote it (punctuation included), each timed word's characters spread
    over its span, what lies between two words at the end of the first."""

    chars: list[str] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    taken: int = 0
    _end: float = 0.0  # the last word's end
    _segments: dict[int, str] = field(default_factory=dict)
    _cursor: dict[int, int] = field(default_factory=dict)  # per segment: where its next word is looked for
    _segment: int | None = None  # the segment of the last word placed

    def segment(self, index: int, text: str) -> None:
        if len(self._segments) < 4096:  # an utterance's segments are bounded by its text; this is the backstop
            self._segments[index] = text

    def words(self, words: list[WordTime]) -> None:
        for w in words:
            if len(self.chars) > 1 << 16:
                return
            start = max(float(w.start_ms), self._end)
            end = max(float(w.end_ms), start)
            lead = ""
            if self._segment is not None and w.segment_index != self._segment:
                self._tail(self._segment)
                lead = " "
            self._segment = w.segment_index
            text, cursor = self._segments.get(w.segment_index, ""), self._cursor.get(w.segment_index, 0)
            at = text.find(w.word, cursor) if text else -1
            if at >= 0:
                gap = text[cursor:at]
                self._cursor[w.segment_index] = at + len(w.word)
            else:
                gap = " " if self.chars else ""
            if lead and not gap.startswith(" "):
                gap = lead + gap
            for ch in gap:
                self._add(ch, self._end)
            step = (end - start) / max(1, len(w.word))
            for i, ch in enumerate(w.word):
                self._add(ch, start + i * step)
            self._end = end

    def _tail(self, index: int) -> None:
        """The segment's text after its last word ("?", a closing quote), at that word's end."""
        text = self._segments.get(index, "")
        for ch in text[self._cursor.get(index, len(text)) :].rstrip()[:256]:
            self._add(ch, self._end)
        self._cursor[index] = len(text)

    def _add(self, ch: str, at: float) -> None:
        self.chars.append(ch)
        self.starts.append(at)

    def take(self, a: float, b: float, offset: float) -> tuple[Alignment, Alignment | None]:
        """The characters starting before `b` not sent yet, for one audio message spanning [a, b) ms:
        relative to `a` and spanning exactly b - a (a message that starts no character carries one empty
        one, which advances a reader's clock and adds no text), and on the context's clock (+ `offset`)."""
        i, j = self.taken, self.taken
        while j < len(self.chars) and self.starts[j] < b:
            j += 1
        self.taken = j
        if i == j:
            return Alignment([""], [0], [round(b - a)]), None
        rel = [max(0, round(s - a)) for s in self.starts[i:j]]
        span = round(b - a)
        rel = [min(r, span) for r in rel]
        durs = [max(0, nxt - cur) for cur, nxt in zip(rel, [*rel[1:], span], strict=True)]
        return Alignment(self.chars[i:j], rel, durs), self._absolute(i, j, offset)

    def rest(self, at: float, offset: float) -> tuple[Alignment, Alignment] | None:
        """What was not sent when the audio ended (words timed past it), then a space ending the last word,
        no later than the audio's end `at` (the context's next utterance starts there), with no length."""
        if not self.chars:
            return None
        self._end = max(self.starts[-1], min(self._end, at))
        if self._segment is not None:
            self._tail(self._segment)
        i = self.taken
        self._add(" ", self._end)
        self.taken = len(self.chars)
        chars = self.chars[i:]
        rel = Alignment(chars, [0] * len(chars), [0] * len(chars))
        return rel, self._absolute(i, len(self.chars), offset)

    def _absolute(self, i: int, j: int, offset: float) -> Alignment:
        starts = [round(offset + s) for s in self.starts[i:j]]
        ends = [*starts[1:], round(offset + max(self._end, self.starts[j - 1]))]
        return Alignment(self.chars[i:j], starts, [max(0, e - s) for s, e in zip(starts, ends, strict=True)])


# -- the wire ---------------------------------------------------------------------------------------


@dataclass
class _Playing:
    """An utterance whose audio is being sent: on multi-stream-input one per context at most (a context's
    utterances play in order; contexts interleave), on stream-input one."""

    index: int
    context_id: str | None
    offset: float  # its context's clock at its start
    timeline: CharTimeline
    sent_ms: float = 0.0


class ElevenLabsWire:
    """`multi`: the multi-stream-input socket (contexts by id; `contextId` on every message), whose contexts
    interleave as ElevenLabs' do: each context's audio is sent as it is made (`audio`, every frame with its
    utterance), and the client plays the contexts it wants. Else the single-context stream-input one, whose
    `{"text": ""}` ends the input and, once its audio is out, the socket (`stop`)."""

    def __init__(self, send: SendText, fmt: OutputFormat, *, multi: bool, stop: Callable[[], None],
                 max_contexts: int) -> None:  # fmt: skip
        self._send, self.fmt, self.multi, self._stop = send, fmt, multi, stop
        self.contexts = Contexts(4 * max_contexts + 4)
        self._timelines: dict[int, CharTimeline] = {}  # by utterance index, until its audio starts
        self._playing: dict[int, _Playing] = {}  # by utterance index, from its audio.start to its audio.done
        self._mp3: dict[str | None, Mp3Stream] = {}

    # -- in --

    def inbound(self, raw: str) -> list[msgspec.Struct]:
        msg = decode(raw)
        cid = msg.context_id if self.multi else None
        if msg.close_socket:
            return close_socket()
        out: list[msgspec.Struct] = []
        if msg.text is not None:
            if msg.text == "" and not self.multi:  # stream-input's end of input
                return self.contexts.done(None, Marker.FINAL)
            if msg.text:  # multi-stream's "" is a keep-alive: nothing opens, nothing ends
                state = self.contexts.get(cid)
                if state is not None and state.closing and self.multi:
                    raise ProtocolError("context_closed", f"context {quote(cid)} was closed; open a new one",
                                        context_id=cid)  # fmt: skip
                out += self.contexts.text(cid, msg.text)
        if msg.flush:
            out += self.contexts.done(cid, Marker.FLUSHED)
        if msg.close_context and self.multi:
            out += self._close(cid)
        return out

    def _close(self, cid: str | None) -> list[msgspec.Struct]:
        """close_context: a context whose text was all flushed finishes its audio, then isFinal. A second
        close, or one while text is still open (a client flushes before a graceful close), is a barge-in:
        its audio is cut."""
        state = self.contexts.get(cid)
        if state is None or state.ended:
            return []
        if state.closing or state.open_text:
            return self.contexts.cancel(cid)
        return self.contexts.done(cid, Marker.FINAL)

    # -- out --

    async def outbound(self, data: bytes | str, event: Event | None) -> None:
        if event is None:  # a frame of the one utterance playing (stream-input: nothing interleaves)
            assert isinstance(data, bytes)
            await self._audio(data, self._playing[next(reversed(self._playing))] if self._playing else None)
        elif isinstance(event, SegmentCommitted):
            self._timeline(event.utterance_index).segment(event.segment_index, event.text)
        elif isinstance(event, AudioWords):
            self._timeline(event.utterance_index).words(event.words)
        elif isinstance(event, AudioStart):
            self._start(event)
        elif isinstance(event, AudioDone):
            await self._audio_done(event.utterance_index)
        elif isinstance(event, SessionDone):
            await self._session_done(context_of(event.context_id))
        elif isinstance(event, AudioCancelled):
            await self._cancelled(context_of(event.context_id))
        elif isinstance(event, Error):
            await self._error(event)
        # session.ready, audio.mark, audio.waiting: nothing in this protocol

    async def audio(self, data: bytes, utterance: int) -> None:
        """An audio frame of `utterance` (multi-stream-input: contexts interleave)."""
        await self._audio(data, self._playing.get(utterance))

    def _start(self, event: AudioStart) -> None:
        cid, index = context_of(event.context_id), event.utterance_index
        state = self.contexts.open(cid)
        while len(self._playing) >= 32:  # those whose audio.done never came (failed): each context plays one
            del self._playing[next(iter(self._playing))]
        self._playing[index] = _Playing(index, cid, state.sent_ms, self._timeline(index))
        self._timelines.pop(index, None)

    def _timeline(self, index: int) -> CharTimeline:
        if (p := self._playing.get(index)) is not None:
            return p.timeline
        timeline = self._timelines.get(index)
        if timeline is None:
            while len(self._timelines) >= 32:  # those of utterances that never played (cancelled, failed)
                del self._timelines[next(iter(self._timelines))]
            timeline = self._timelines[index] = CharTimeline()
        return timeline

    async def _audio(self, data: bytes, p: _Playing | None) -> None:
        if p is None:
            return
        state = self.contexts.open(p.context_id)
        if state.ended:
            return
        ms = len(data) / self.fmt.bytes_per_sample * 1000 / self.fmt.rate
        a, b = p.sent_ms, p.sent_ms + ms
        p.sent_ms, state.sent_ms = b, state.sent_ms + ms
        rel, absolute = p.timeline.take(a, b, p.offset)
        await self._put(AudioOut(audio=self._encoded(p.context_id, data), alignment=rel,
                                 normalized_alignment=absolute, context_id=self._id(p.context_id)))  # fmt: skip

    def _encoded(self, cid: str | None, pcm: bytes) -> str:
        if self.fmt.mp3_kbps is not None:
            mp3 = self._mp3.get(cid)
            if mp3 is None:
                mp3 = self._mp3[cid] = Mp3Stream(self.fmt.rate, self.fmt.mp3_kbps)
            pcm = mp3.feed(pcm)
        return base64.b64encode(pcm).decode()

    async def _audio_done(self, index: int) -> None:
        p = self._playing.pop(index, None)
        if p is None:
            return
        state = self.contexts.open(p.context_id)
        if state.ended:
            return
        rest = p.timeline.rest(p.sent_ms, p.offset)
        if rest is not None:
            cid = self._id(p.context_id)
            await self._put(AudioOut(alignment=rest[0], normalized_alignment=rest[1], context_id=cid))

    async def _session_done(self, cid: str | None) -> None:
        marker = self.contexts.finished(cid)
        if marker is not None and marker[0] is Marker.FINAL:
            await self._final(cid)

    async def _cancelled(self, cid: str | None) -> None:
        state = self.contexts.get(cid)
        for index in [i for i, p in self._playing.items() if p.context_id == cid]:
            del self._playing[index]
        if state is not None and state.closing and not state.ended:
            await self._final(cid)

    async def _final(self, cid: str | None) -> None:
        state = self.contexts.open(cid)
        if state.ended:
            return
        state.ended = True
        mp3 = self._mp3.pop(cid, None)
        if mp3 is not None and (tail := mp3.finish()):
            await self._put(AudioOut(audio=base64.b64encode(tail).decode(), context_id=self._id(cid)))
        await self._put(FinalOut(is_final=True, context_id=self._id(cid)))
        if not self.multi:
            self._stop()  # stream-input: the socket ends with its one context

    async def _error(self, ev: Error) -> None:
        cid = context_of(ev.context_id)
        if ev.code == "utterance_timeout" and ev.action == "finished":
            state = self.contexts.open(cid)  # the server finished it: its session.done is owed no marker
            state.open_text = False
            state.markers.append((Marker.FLUSHED, 0))
        await self._send(error_message(ev.code, ev.message, cid if self.multi else None))

    def _id(self, cid: str | None) -> str | UnsetType:
        return cid if self.multi and cid is not None else UNSET

    async def _put(self, msg: msgspec.Struct) -> None:
        await self._send(_encoder.encode(msg).decode())
