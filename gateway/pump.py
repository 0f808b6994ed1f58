"""One utterance's audio, from its engine stream to the connection's outbox.

One loop (`Pump`) does what every output mode shares — the first-audio time, `audio.waiting`,
segment marks and the backlog they clear, giving the engine's capacity back, the engine's errors,
the spoken log and the done events — and hands the audio itself to a sink: `PcmSink` (frames or one
file, resampled and trimmed, with the words' timings: `audio.words`, or vLLM-Omni's `audio.chunk`) or
`CodecSink` (codec_tokens messages for on-device decoding).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np
from msgspec import UNSET, UnsetType

from engine import AudioChunk, CodecFrames, StreamEnd, Waiting, Words
from gateway import metrics
from gateway.audio import Resampler, WholeFile, encode_frames
from gateway.outbox import Outgoing
from gateway.playback import Playback
from gateway.protocol import (
    AudioChunkMessage,
    AudioDone,
    AudioMark,
    AudioStart,
    AudioWaiting,
    AudioWords,
    CodecDone,
    CodecFlag,
    CodecStart,
    OmniWord,
    ServerEvent,
    SessionDone,
    WordTime,
    pack_codec_header,
    quote,
)
from gateway.queued_stream import Refusal
from gateway.seams import Emitter, SessionView
from gateway.timing import ResponseClock, Timing, observe, trim_for
from gateway.utterance import Utterance

Chunk = AudioChunk | CodecFrames


class Sink(Protocol):
    """Where one output mode puts an utterance's audio; `clock` times what it sent."""

    clock: ResponseClock
    started: bool  # its first audio came
    full: bool  # it holds all it may (a file at max_file_audio_s): the rest of the utterance is not made

    async def start(self, ev: Chunk) -> None: ...  # the stream's first audio is here
    def words(self, ev: Words) -> None: ...  # the engine's word timings, before the audio that speaks them
    async def audio(self, ev: Chunk, mark: int | None) -> None: ...  # `mark`: a segment whose audio begins here
    async def tail(self) -> None: ...  # the stream has ended: send what is held
    async def done(self, failed: bool, timing: Timing) -> ServerEvent: ...  # the utterance's done event


class Pump:
    """Sends utterances' audio: reads the session through `view`, tells the client through `out`, hands
    the engine's capacity back with `release` as soon as a stream ends, and `detach`es an utterance whose
    stream ended before input.done from its text intake."""

    def __init__(self, view: SessionView, out: Emitter, release: Callable[[Utterance], Awaitable[None]],
                 detach: Callable[[Utterance], bool]) -> None:  # fmt: skip
        self._view, self._out, self._release, self._detach = view, out, release, detach

    async def run(self, utt: Utterance) -> None:
        """Send the utterance's audio, then its done events (none once it is cancelled)."""
        view, out = self._view, self._out
        if utt.stream is None:  # nothing to say: close the utterance in order, without audio
            timing = ResponseClock(view.sample_rate, None, utt.queue_wait_s).record()
            await out.emit(SessionDone(utterance_index=utt.index, total_sentences=0, timing=timing))
            return
        sink: Sink = CodecSink(view, out, utt) if view.codec_mode else PcmSink(view, out, utt)
        model = view.model  # the model it is spoken by: a later session.config may name another
        end = await self._stream(utt, sink)
        if end is None:
            return
        # The engine is done with this stream: free the tenant's slot before telling the client, so its
        # next utterance can start at once.
        await self._release(utt)
        if utt.cancelled or end.reason == "cancelled":
            return
        await sink.tail()
        end = self._ended_early(utt, end)
        failed = end.reason == "error"
        if failed:
            await self._engine_failed(utt, end)
        timing = self._timed(sink.clock, utt, failed, model)
        await out.emit(await sink.done(failed, timing))
        # Redis has the spoken log before the client hears the utterance is done (a resume elsewhere right
        # after session.done sees it).
        await view.session.record(utt.index, utt.text, cancelled=failed)
        await out.emit(SessionDone(utterance_index=utt.index, total_sentences=len(utt.segments), timing=timing))

    async def _waiting(self, utt: Utterance, ev: Waiting) -> None:
        """Say why audio is late, not leave a silence: a wait for capacity. A first audio held for pacing
        is admission's measure (gateway/queued_stream.py), not a wait the client can do anything about."""
        if ev.reason != "pacing":
            await self._out.emit(AudioWaiting(utterance_index=utt.index, reason=ev.reason, ahead=ev.ahead))

    async def _stream(self, utt: Utterance, sink: Sink) -> StreamEnd | None:
        """The engine stream's audio into `sink`; how the stream ended (None: the utterance was cancelled)."""
        assert utt.stream is not None
        heard = False
        async for ev in utt.stream.events():
            if utt.cancelled:
                return None
            if isinstance(ev, StreamEnd):
                return ev
            if isinstance(ev, Words):
                sink.words(ev)
                continue
            if not isinstance(ev, AudioChunk | CodecFrames):
                await self._waiting(utt, ev)
                continue
            if not sink.started:
                await sink.start(ev)
            prime = isinstance(ev, CodecFrames) and ev.prime
            if not heard and not prime:
                heard = True
                metrics.TTFA.observe(time.monotonic() - utt.opened_at)
            seg = None if prime else utt.segment_of(ev.segment)
            mark = seg if seg is not None and seg not in utt.marked else None
            if mark is not None:
                self._view.backlog.heard(utt, mark)
            await sink.audio(ev, mark)
            if sink.full:
                utt.stream.cancel()
                return self._file_full(utt)
        return None if utt.cancelled else StreamEnd("done")

    def _file_full(self, utt: Utterance) -> StreamEnd:
        """The utterance's file holds `max_file_audio_s` of audio: the rest is not made, the file made so far
        is sent, and the segments not spoken are named (`file_too_long`). It takes no more text: later text
        starts the next utterance."""
        bound = self._view.limits.max_file_audio_s
        message = f"utterance {utt.index}'s file reached max_file_audio_s ({bound:g} s of audio); the rest was not made"
        if self._detach(utt) and (pending := utt.segmenter.pending):
            message += f"; the text not yet committed ({quote(pending, 80)}) was dropped"
        return StreamEnd("error", message, code="file_too_long")

    def _ended_early(self, utt: Utterance, end: StreamEnd) -> StreamEnd:
        """An engine stream that ends before input.done cannot speak text sent after it: the utterance is
        closed here (later text starts the next one) and the end becomes an error."""
        if end.reason != "done" or utt.finished:
            return end
        message = "the engine ended the utterance before input.done"
        if self._detach(utt) and (pending := utt.segmenter.pending):
            message += f"; the text not yet committed ({quote(pending, 80)}) was dropped"
        return StreamEnd("error", message)

    async def _engine_failed(self, utt: Utterance, end: StreamEnd) -> None:
        """The engine's error, naming the committed segments whose audio never began."""
        if isinstance(end, Refusal):
            return  # the client was told which segments when admission refused them
        unspoken = [i for i in utt.engine_segments if i not in utt.marked]
        message = end.message or "synthesis failed"
        if unspoken:
            message += f"; segments {', '.join(map(str, unspoken))} of utterance {utt.index} were not spoken"
        await self._out.error(end.code or "engine_error", message, utterance_index=utt.index,
                              segment_indexes=unspoken)  # fmt: skip

    def _timed(self, clock: ResponseClock, utt: Utterance, failed: bool, model: str) -> Timing:
        """The utterance's timing record; a complete one also goes to the histograms. Its start and queue
        wait are read now: admission sets them when it lets the text go in, which may follow the pump's
        start."""
        clock.start, clock.queue_wait_s = utt.engine_at, utt.queue_wait_s
        timing = clock.record()
        if not failed:
            observe(timing, model, self._view.session.tenant.name)
        return timing


class PcmSink:
    """PCM, μ-law or A-law frames as they are made (or one file per utterance), at the session's rate:
    resampled, the leading silence trimmed, each mark sent just before its audio. Word timings (the
    engine's, else estimated at each mark: gateway/words.py) are placed on the same clock — samples sent,
    after the trim — and sent, when the session asked, with the marks before the audio that holds them."""

    def __init__(self, view: SessionView, out: Emitter, utt: Utterance) -> None:
        assert view.config is not None
        self._view, self._out, self._utt, self._cfg = view, out, utt, view.config
        self.rate = view.sample_rate
        self.clock = ResponseClock(self.rate, None)
        self.started = False
        self._resample: Resampler | None = None
        self._trim = trim_for(self.rate, view.limits)
        self._marks: list[tuple[int, int]] = []  # (segment, sample offset before the trim), sent with their audio
        # the engine's words per segment, (word, start, end) samples before the trim, placed with the marks
        self._words: list[tuple[int, list[tuple[str, int, int]], bool]] = []
        self._omni = self._cfg.omni_timestamps and self._cfg.streamed  # vLLM-Omni's audio.chunk messages
        self._omni_words: list[OmniWord] = []
        self._chunk_id = 0
        self.full = False
        self._file = WholeFile(self.rate, self._cfg.response_format)
        self._playback = Playback()

    async def start(self, ev: Chunk) -> None:
        assert isinstance(ev, AudioChunk)
        self.started = True
        self._resample = Resampler(ev.sample_rate, self.rate)
        await self._audio_start()

    def words(self, ev: Words) -> None:
        seg = self._utt.segment_of(ev.segment)
        if seg is None:
            return
        scale = self.rate / ev.sample_rate
        placed = [(w.word, round(w.start * scale), round(w.end * scale)) for w in ev.words]
        self._words.append((seg, placed, ev.estimated))

    async def audio(self, ev: Chunk, mark: int | None) -> None:
        assert isinstance(ev, AudioChunk) and self._resample is not None
        if mark is not None:
            self._marks.append((mark, ev.first_frame * self.rate // ev.sample_rate))
        await self._send(self._resample(ev.pcm))

    async def tail(self) -> None:
        if self._resample is not None:
            await self._send(self._resample(np.zeros(0, np.int16), last=True))  # the resampler's filter tail
            await self._send(self._trim.flush())  # an utterance of near-silence only: what the trim held
        else:
            await self._audio_start()  # paired with audio.done even when no audio came
        await self._timed_words(self._utt.words.close_before(None), estimated=False)
        if self._omni:  # vLLM-Omni's last chunk: no audio, the utterance's end, every word's span
            end = round(self._utt.words.sent_ms)
            await self._out.emit(AudioChunkMessage(
                utterance_index=self._utt.index, chunk_id=self._chunk_id, chunk_start_ms=0, chunk_end_ms=end,
                sample_rate=self.rate, audio_b64="", timestamps=self._omni_words))  # fmt: skip
        if self._file.samples:
            data, whole = await asyncio.to_thread(self._file.finish)
            self._utt.sent_bytes = len(data)
            await self._out.outbox.put(Outgoing(data, self._utt.index))
            self._view.backlog.file_sent(self._utt)
            # The file is the first and the last audio. Its onset search reads the whole file (0.6 s for
            # 300 s at 48 kHz): off the event loop, timed when the file was queued.
            await asyncio.to_thread(self.clock.audio, whole, time.monotonic())
        self.clock.trimmed = self._trim.trimmed

    async def done(self, failed: bool, timing: Timing) -> ServerEvent:
        return AudioDone(utterance_index=self._utt.index, total_bytes=self._utt.sent_bytes, error=failed,
                         timing=timing)  # fmt: skip

    async def _audio_start(self) -> None:
        fmt = self._cfg.response_format
        await self._out.emit(AudioStart(utterance_index=self._utt.index, sample_rate=self.rate, format=fmt,
                                        word_timestamps=True if self._omni else UNSET))  # fmt: skip

    async def _send(self, pcm: np.ndarray) -> None:
        pcm = self._trim.feed(pcm)
        if self._trim.pending:  # the start is held until the trim is decided; its marks wait with it
            return
        words = self._utt.words
        for seg, spoken, estimated in self._words:  # first: a segment the engine timed needs no estimate at its mark
            placed = [(w, self._ms(s - self._trim.trimmed), self._ms(e - self._trim.trimmed)) for w, s, e in spoken]
            timed = words.timed(seg, self._utt.segments[seg].text, placed, estimated=estimated)
            await self._timed_words(timed, estimated=estimated)
        self._words.clear()
        for seg, offset in self._marks:  # offsets count the audio sent: the trimmed start is not
            offset = max(0, offset - self._trim.trimmed)
            await self._out.emit(AudioMark(utterance_index=self._utt.index, segment_index=seg, sample_offset=offset))
            await self._timed_words(words.marked(seg, self._utt.segments[seg].text, self._ms(offset)), estimated=True)
        self._marks.clear()
        if pcm.size == 0:  # e.g. the resampler's tail when no resampling was needed
            return
        start_ms = words.sent_ms
        words.sent_ms += self._ms(pcm.size)
        if not self._cfg.streamed:
            self._file.add(pcm)
            self._view.backlog.held(self._utt, pcm.size / self.rate)
            self.full = self._utt.file_s >= self._view.limits.max_file_audio_s
            return
        data = encode_frames(pcm, self._cfg.response_format)
        self._utt.sent_bytes += len(data)
        self._playback.add(pcm.size / self.rate)
        heard_by(self._view, self._utt).add(pcm.size / self.rate)
        if self._omni:  # the audio as JSON; marked as audio, so a cancel purges it like a binary frame
            msg = AudioChunkMessage(utterance_index=self._utt.index, chunk_id=self._chunk_id,
                                    chunk_start_ms=round(start_ms), chunk_end_ms=round(words.sent_ms),
                                    sample_rate=self.rate, audio_b64=base64.b64encode(data).decode(), timestamps=None)
            self._chunk_id += 1
            await self._out.emit(msg, audio_of=self._utt.index)  # stamped: a context's chunk carries its context_id
        else:
            await self._out.outbox.put(Outgoing(data, self._utt.index))
        self.clock.audio(pcm)

    def _ms(self, samples: int) -> float:
        return max(0, samples) * 1000 / self.rate

    async def _timed_words(self, words: list[WordTime], *, estimated: bool) -> None:
        """Words just placed, to the client when it asked for them (the marks before the audio)."""
        if not words or not self._cfg.word_timestamps:
            return
        if self._omni:
            self._omni_words += [OmniWord(w.word, w.start_ms, w.end_ms) for w in words]
            return
        await self._out.emit(AudioWords(utterance_index=self._utt.index, words=words, estimated=estimated))


class CodecSink:
    """codec_tokens mode: `codec.start`, binary messages (`pack_codec_header` + int16 codes), `codec.done`.
    A header-only message with SEGMENT_END closes each segment; the last one also carries EOS."""

    def __init__(self, view: SessionView, out: Emitter, utt: Utterance) -> None:
        self._view, self._out, self._utt = view, out, utt
        self._info: dict[str, object] = view.engine.codec_info() or {}
        self._frame_rate = float(self._info.get("frame_rate_hz", 12.5))  # type: ignore[arg-type]
        self.clock = ResponseClock(view.sample_rate, None)  # no trim: codes, not PCM
        self.started = False
        self.full = False  # codes are sent as they are made: nothing is held
        self._segment: int | None = None
        self._codebooks = int(self._info.get("codebooks", 16))  # type: ignore[call-overload]

    def words(self, ev: Words) -> None:
        pass  # never asked for: session.config refuses word_timestamps with codec_tokens (no audio to time)

    async def start(self, ev: Chunk) -> None:
        self.started = True
        await self._out.emit(CodecStart(utterance_index=self._utt.index, **self._info))  # type: ignore[arg-type]

    async def audio(self, ev: Chunk, mark: int | None) -> None:
        assert isinstance(ev, CodecFrames)
        if ev.prime:  # the reference frames an ICL clone's decoder starts from: decoded, never played
            await self._frames(ev.codes, CodecFlag.PRIME)
            return
        seg = self._utt.segment_of(ev.segment)
        if self._segment is not None and seg != self._segment:
            await self._frames(self._no_frames, CodecFlag.SEGMENT_END)
        if mark is not None:
            await self._out.emit(AudioMark(utterance_index=self._utt.index, segment_index=mark,
                                           frame_offset=ev.first_frame))  # fmt: skip
            # The talker times no words: the segment's are placed from its mark on the clock of the frames
            # played, so a cancel's played_ms is cut as in PCM mode (heard_text, estimated).
            at_ms = self._utt.codec_frames * 1000 / self._frame_rate
            self._utt.words.marked(mark, self._utt.segments[mark].text, at_ms)
        self._segment = seg
        await self._frames(ev.codes, 0)

    async def tail(self) -> None:
        pass  # nothing is held back

    async def done(self, failed: bool, timing: Timing) -> ServerEvent:
        if self.started and not failed:
            await self._frames(self._no_frames, CodecFlag.SEGMENT_END | CodecFlag.EOS)
        return codec_done(self._utt, error=failed, cancelled=False, timing=timing)

    @property
    def _no_frames(self) -> np.ndarray:
        return np.zeros((0, self._codebooks), np.int16)

    async def _frames(self, codes: np.ndarray, flags: int) -> None:
        utt, n = self._utt, codes.shape[0]
        first = CodecFlag.RESET if utt.codec_seq == 0 else 0
        data = pack_codec_header(utt.codec_seq, n, flags | first) + codes.astype("<i2", copy=False).tobytes()
        utt.codec_seq += 1
        played = not flags & CodecFlag.PRIME
        if played:
            utt.codec_frames += n
            utt.words.sent_ms += n * 1000 / self._frame_rate  # the utterance's clock: the frames played
            heard_by(self._view, self._utt).add(n / self._frame_rate)
        utt.sent_bytes += len(data)
        await self._out.outbox.put(Outgoing(data, utt.index))
        if n and played:
            self.clock.codec(n / self._frame_rate)


def heard_by(view: SessionView, utt: Utterance) -> Playback:
    """The player that hears `utt`: its own (its context's) or the session's."""
    return utt.listener or view.listener


def codec_done(utt: Utterance, *, error: bool, cancelled: bool, timing: Timing | UnsetType = UNSET,
               spoken_text: str | UnsetType = UNSET, **heard: Any) -> CodecDone:  # fmt: skip
    """`codec.done`, built one way whether the utterance ended or was cancelled (`heard`: a cancel's
    `heard_text` and `heard_estimated`, `Utterance.heard_fields`)."""
    return CodecDone(utterance_index=utt.index, total_frames=utt.codec_frames, seq_last=utt.codec_seq - 1,
                     error=error, cancelled=cancelled, timing=timing, spoken_text=spoken_text, **heard)  # fmt: skip
