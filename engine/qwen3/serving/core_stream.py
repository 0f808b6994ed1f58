"""What the Qwen3 engine core is configured with (`CoreConfig`) and keeps per stream: the stream itself
(`CoreStream`) and the talker request now speaking it (`TalkerRequest`), the commands other threads post,
and the core's `CoreStats`.

A stream lives from `submit` to its end and speaks its text in as many requests as it takes; a request
lives from its prefill to the release of its slot and is a fresh object each time, so nothing of one
request leaks into the next. Everything per request is bounded by its KV context; per stream only the
pending text (bounded by what the caller commits ahead of the audio) and counters.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from engine.listening import ListenerTimeline
from engine.qwen3.serving.scheduler import DEFAULT_RAMP, RequestRecord, Status
from engine.resample import Resampler
from engine.types import AudioChunk, CodecFrames, Waiting

R = TypeVar("R")

if TYPE_CHECKING:
    from engine.qwen3.codec import CodecState
    from engine.qwen3.generate import SamplingParams
    from engine.qwen3.model import Qwen3TTSModel
    from engine.qwen3.prompt import PromptBuilder, VoiceClone
    from engine.reference import VoiceMaker
    from engine.stream import EventBridge


@dataclass(frozen=True, slots=True)
class CoreConfig:
    max_streams: int = 32  # slots: streams admitted at once (more wait for a free slot)
    max_context: int = 2048  # KV positions per slot: prompt + frames (2048 frames ≈ 164 s of audio)
    max_batch: int = 32  # talker rows per step
    ramp: tuple[int, ...] = DEFAULT_RAMP
    # Streams per batched decode (and a cycle decodes up to the frames of this many full chunks): past 4
    # a decode's activations (rows × 25 frames × 1920 samples × channels) leave the cache
    # (bench/results/core_config.md).
    max_codec_rows: int = 4
    queue_size: int = 8  # audio chunks buffered per stream before its consumer is considered not reading
    # torch intra-op threads of the core thread. 1 for the tiny model: on busy cores waking a second
    # thread costs more than a tiny call (bench/results/core_config.md). A real checkpoint's GEMMs on
    # CPU want more.
    threads: int = 1
    frames_per_token: float = 6.0  # frame cap: text tokens × this + min_frames (real speech: ~2–4)
    min_frames: int = 24
    kv_block: int = 64  # attention key lengths are rounded up to this (few distinct shapes)
    # Smallest batch bucket. On CPU a row's logits were bitwise equal in every batch of >= 4 rows but
    # differed by ~1e-6 at 1, 2 or 3 (GEMM kernel choice): enough to flip a sampled id now and then,
    # so a seeded stream would not reproduce alone vs. batched. Padding one stream to 4 rows costs
    # little: a single-row step is bound by reading the weights, not by arithmetic.
    min_bucket: int = 4
    low_water_s: float = 1.0
    defer_s: float = 2.0
    # A stream's first audio waits (at most this long past its first frame) while the rest of its text
    # is predicted to come after its listener needs it (`Scheduler.holds_first`); 0: never held. Text
    # still to come (not finished) counts as `hold_more_s` of audio more.
    first_hold_s: float = 2.0
    hold_more_s: float = 1.5
    warm_up: bool = True
    # Capture the talker step and the code-predictor pass as CUDA graphs (engine/qwen3/serving/graphs.py). Off the
    # GPU it warns once and runs the same static-buffer path uncaptured.
    cuda_graphs: bool = False
    # A request parked (its text ran dry before finish()) this long gives its slot up when another
    # stream waits for one: it speaks the text it has to its end, and the stream resumes in a fresh
    # request when text comes. Long enough that a pause between two sentences keeps the slot.
    park_evict_s: float = 1.0
    # Text a stream may hold that no request has taken yet; an append past it is refused (`queue_full`).
    # A backstop: the gateway bounds the text committed ahead of the audio far below this.
    max_pending_chars: int = 262144
    # Benchmarks only: every stream ends ("done") after this many frames, whatever text it has left,
    # so streams of one run are equally long. None in service: no committed text goes unspoken.
    max_frames: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= self.max_streams:
            raise ValueError(f"max_batch must be in [1, max_streams={self.max_streams}], got {self.max_batch}")
        # Below one frame per token a request's frame cap could stop before its text was all fed.
        if not (math.isfinite(self.frames_per_token) and self.frames_per_token >= 1.0) or self.min_frames < 1:
            raise ValueError(f"need frames_per_token >= 1 and min_frames >= 1, got {self.frames_per_token}, "
                             f"{self.min_frames}")
        if not (math.isfinite(self.park_evict_s) and self.park_evict_s >= 0):
            raise ValueError(f"park_evict_s must be a number >= 0, got {self.park_evict_s}")
        if not all(math.isfinite(v) and v >= 0 for v in (self.first_hold_s, self.hold_more_s)):
            raise ValueError(f"need first_hold_s and hold_more_s >= 0, got {self.first_hold_s}, {self.hold_more_s}")


@dataclass
class StreamOptions:
    speaker: str | None
    language: str  # model language name ("english", "auto", ...)
    instructions: str | None
    sample_rate: int
    params: SamplingParams
    codec_tokens: bool = False  # stream the talker's frames; no code2wav for this stream
    reference: tuple[bytes, str | None] | None = None  # a cloned voice: its clip's file bytes, transcript
    # A continuation: the seconds of earlier audio its listener has still to hear when it opens
    # (`StreamRequest.listener_buffer_s`; the core makes it `CoreStream.before` on its clock as the
    # stream opens); the first-audio hold lets go before they run out.
    listener_buffer_s: float | None = None


@dataclass(frozen=True)
class ClonedVoice:
    """A Base-model voice made from a reference clip, once (the core's `VoiceMaker`)."""

    clone: VoiceClone
    ref_ids: list[int]  # the transcript's ids (ICL)
    primed: CodecState | None  # ICL: the codec state after decoding the reference frames


@dataclass
class TextLedger:
    """Characters of one stream's text: `appended` counted on the caller's thread, `taken` (into a
    request's prompt or track) on the core's; each has one writer, so plain ints do."""

    appended: int = 0
    taken: int = 0

    @property
    def pending(self) -> int:
        return self.appended - self.taken


# ---- commands into the core (any thread → the core's queue) -------------------------------------------
@dataclass(frozen=True, slots=True)
class Open:
    rid: int
    opts: StreamOptions
    bridge: EventBridge
    ledger: TextLedger


@dataclass(frozen=True, slots=True)
class Append:
    rid: int
    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    rid: int


@dataclass(frozen=True, slots=True)
class Cancel:
    rid: int
    at: float  # perf_counter() when cancel() was called: the core records how long freeing took


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Open | Append | Finish | Cancel | Stop


@dataclass
class TalkerRequest:
    """One request: a prompt prefilled into a KV slot, its text track, the frames it made. Made fresh for
    each request of a stream."""

    slot: int | None = None  # None until the slot is acquired
    track: torch.Tensor | None = None  # [N, H] text rows; frame g+1's talker input uses row g
    pad_row: torch.Tensor | None = None
    ids: list[int] = field(default_factory=list)  # content ids of its text (the prompt's too)
    token_segments: list[int] = field(default_factory=list)  # segment of each content token
    track_offset: int = 0  # content index of text row 0 (ICL: see EngineCore._admit)
    extra_rows: int = 0  # track rows that are not content: an ICL transcript longer than its reference
    prompt_len: int = 0
    eos_fed: bool = False
    ended_by_eos: bool = False  # the model said EOS (else the frame cap stopped it)
    frames: int = 0  # frames completed by the code predictor
    codes: list[torch.Tensor] = field(default_factory=list)  # completed, not yet decoded [16] each
    frames_decoded: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.token_segments)

    @property
    def rows(self) -> int:
        """Text rows of its track that carry text (content and an ICL transcript's overflow)."""
        return self.n_tokens + self.extra_rows

    def segment_of(self, frame: int) -> int:
        """The segment a frame belongs to: that of the text row the talker read for it."""
        return self.token_segments[min(frame, self.n_tokens - 1)] if self.token_segments else 0

    def feed_eos(self, prompts: PromptBuilder) -> None:
        """Close the text track: the end-of-text row, then padding until EOS or the frame cap."""
        if not self.eos_fed:
            assert self.track is not None
            self.track = torch.cat([self.track, prompts.eos_row()])
            self.eos_fed = True

    def next_text_row(self) -> torch.Tensor | None:
        """The text row of the next talker step; None: the track ran dry before its end (parked)."""
        assert self.track is not None
        g = self.frames - 1  # the step that makes frame `frames` consumes text row frames-1
        if g < self.track.shape[0]:
            return self.track[g]
        return self.pad_row if self.eos_fed else None


@dataclass
class CoreStream:
    """One stream: its text not yet taken, its voice, its audio on the way out, and the request now
    speaking it (`talk`, None between requests). `record` is what the scheduler reads; the core writes
    its facts in one place (`EngineCore._records`) and moves its status only with `RequestRecord.to`."""

    rid: int
    opts: StreamOptions
    bridge: EventBridge
    record: RequestRecord
    ledger: TextLedger = field(default_factory=TextLedger)
    pending_text: deque[tuple[int, str]] = field(default_factory=deque)  # (segment, text) no request took yet
    voice: ClonedVoice | Future[ClonedVoice] | None = None  # a future while its clip is being made into a voice
    segments: int = 0  # append calls so far
    carry: str = ""  # whitespace cut from the end of the last piece (it belongs before the next word)
    finished: bool = False
    prompt_rows: int | None = None  # rows of this stream's prompts (the voice decides; the text does not)
    talk: TalkerRequest | None = None
    requests: int = 0  # requests started
    frames_before: int = 0  # frames of its earlier requests
    codec_carry: CodecState | None = None  # the decoder state between two requests (pcm output)
    resampler: Resampler | None = None
    outbox: deque[AudioChunk | CodecFrames | Waiting] = field(default_factory=deque)
    samples_out: int = 0  # PCM samples handed out, at the stream's rate
    last_segment: int = 0  # segment of the latest audio
    fed_tokens: int = 0  # content tokens the talker consumed, all requests
    fed_segments: int = 0  # segments with tokens consumed
    fed_last: int = -1  # the latest of them
    waiting_told: bool = False  # a Waiting notice went out for the current wait
    # ---- facts the record mirrors (EngineCore._records)
    arrival: float = 0.0  # when it queued for a slot: opened, or an evicted stream queuing again
    before: ListenerTimeline | None = None  # a continuation: its listener's timeline of the audio before it
    chunks_sent: int = 0  # code2wav chunks since it last queued (position on the ramp)
    audio_s: float = 0.0
    first_audio_at: float | None = None
    first_frame_at: float | None = None

    @property
    def ended(self) -> bool:
        return self.record.ended

    @property
    def slot(self) -> int | None:
        return self.talk.slot if self.talk is not None else None

    @property
    def frames(self) -> int:
        """Frames made, all requests."""
        return self.frames_before + (self.talk.frames if self.talk is not None else 0)

    @property
    def icl(self) -> bool:
        return isinstance(self.voice, ClonedVoice) and self.voice.clone.icl

    @property
    def voice_arg(self) -> VoiceClone | str | None:
        """The voice as the prompt builder takes it."""
        return self.voice.clone if isinstance(self.voice, ClonedVoice) else self.opts.speaker

    def at_max_frames(self, max_frames: int | None) -> bool:
        return max_frames is not None and self.frames >= max_frames

    def talker_done(self) -> None:
        """The talker owes the request no more frames (EOS, frame cap): its last frames decode."""
        self.record.to(Status.EVICTED if self.record.status is Status.EVICTING else Status.DRAINING)

    def tell_waiting(self, ahead: int) -> None:
        """Tell the consumer once per wait that its audio waits for a slot, with `ahead` streams before it."""
        if not self.waiting_told:
            self.waiting_told = True
            self.outbox.append(Waiting("capacity", ahead))

    def queue_pcm(self, pcm: np.ndarray, segment: int) -> None:
        if pcm.size:
            self.outbox.append(AudioChunk(pcm, self.opts.sample_rate, self.samples_out, segment))
            self.samples_out += pcm.size
            self.last_segment = segment

    def queue_wav(self, wav: np.ndarray, segment: int) -> None:
        """Decoded audio at the model's rate → PCM16 at the stream's rate, into the outbox."""
        if self.resampler is not None:
            pcm = self.resampler.push(wav)
        else:
            pcm = (np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
        self.queue_pcm(pcm, segment)

    def flush(self) -> bool:
        """Hand the outbox to the consumer while it takes. False: the stream's bridge has ended (cancelled),
        its audio dropped. A chunk the consumer does not take stays: the stream is paused meanwhile."""
        while self.outbox:
            try:
                if not self.bridge.put(self.outbox[0], timeout=0):
                    self.outbox.clear()
                    return False
            except TimeoutError:
                return True
            self.outbox.popleft()
        return True


@dataclass
class CoreStats:
    """The core's counters and recent timings, written by the core thread only (others read a snapshot)."""

    cycles: int = 0
    prefills: int = 0
    talker_rows: int = 0  # rows stepped
    frames: int = 0  # frames completed by the code predictor
    decode_calls: int = 0
    evictions: int = 0  # parked requests that gave their slot to a waiting stream
    # CPU seconds the core thread spent in working cycles: capacity on a shared machine, where wall time
    # also counts other processes' turns
    cpu_s: float = 0.0
    batch_rows: int = 0  # rows the last working cycle's time was charged to
    batch_frames: int = 0  # frames it completed
    cycle_s: deque[float] = field(default_factory=lambda: deque(maxlen=4096))  # working cycles' durations
    cancel_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=4096))  # cancel() → slot freed
    # per finished stream (recent 4096): frames made; (requests, segments with consumed tokens, tokens)
    finished_frames: dict[int, int] = field(default_factory=dict)
    finished_text: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def finished(self, stream: CoreStream) -> None:
        self.finished_frames[stream.rid] = stream.frames
        self.finished_text[stream.rid] = (stream.requests, stream.fed_segments, stream.fed_tokens)
        for done in (self.finished_frames, self.finished_text):
            if len(done) > 4096:  # a long-running server keeps only recent ones
                del done[next(iter(done))]


def open_stream(cmd: Open, now: float, model_rate: int, voices: VoiceMaker[ClonedVoice]) -> CoreStream:
    opts = cmd.opts
    stream = CoreStream(cmd.rid, opts, cmd.bridge, RequestRecord(cmd.rid, now), ledger=cmd.ledger, arrival=now)
    stream.before = ListenerTimeline.from_buffer(now, opts.listener_buffer_s)
    if opts.sample_rate != model_rate:
        stream.resampler = Resampler(model_rate, opts.sample_rate)
    if opts.reference is not None:
        stream.voice = voices.get(*opts.reference)
    return stream


def prompt_rows(model: Qwen3TTSModel, stream: CoreStream) -> int:
    """Rows of a stream's prompts: instructions, role, codec prefix, the first text token — and an ICL
    clone's reference frames. The voice decides; the length of the text does not. Built once a stream."""
    if stream.prompt_rows is None:
        probe = model.tokenizer.content_ids("a")[:1]
        stream.prompt_rows = model.build_prompt(
            probe, voice=stream.voice_arg, language=stream.opts.language,
            instructions=stream.opts.instructions, streaming_text=True, final=True,
        ).rows.shape[0]
    return stream.prompt_rows


@torch.no_grad()
def make_voice(model: Qwen3TTSModel, audio: np.ndarray, rate: int, transcript: str | None) -> ClonedVoice:
    """A reference clip → the voice (x-vector; with a transcript and the codec encoder, ICL frames), and
    for ICL the codec state primed with the reference frames, so the first chunk continues the
    reference's audio instead of starting from silence. Runs on the `VoiceMaker`'s thread: the modules
    keep no state between calls (the decoder's state is the `CodecState` passed in)."""
    clone = model.clone_voice(audio, rate, ref_text=transcript)
    if not clone.icl:
        return ClonedVoice(clone, [], None)
    assert clone.ref_codes is not None and clone.ref_text is not None
    primed = model.codec.new_state(1)
    model.codec.step(clone.ref_codes.T[None].to(model.device), primed)
    return ClonedVoice(clone, model.tokenizer.ref_ids(clone.ref_text), primed)


def isolated(streams: list[CoreStream], bucket: int, one_bucket: int, fail: Callable[[CoreStream, BaseException], None],
             run: Callable[[list[CoreStream], int], Sequence[R]]) -> list[tuple[CoreStream, R]]:
    """Run a batched call; if it raises, run each row alone (in `one_bucket`) so the failure ends only
    its own stream. Rows are independent and cache writes idempotent, so re-running the survivors is safe."""
    try:
        return list(zip(streams, run(streams, bucket), strict=True))
    except Exception as exc:
        if len(streams) == 1:
            fail(streams[0], exc)
            return []
    out = []
    for s in streams:
        try:
            out.append((s, run([s], one_bucket)[0]))
        except Exception as exc:
            fail(s, exc)
    return out


def deliver(streams: dict[int, CoreStream]) -> None:
    """Hand every stream's outbox to its consumer; a stream that ended and has nothing left to hand out
    leaves `streams` with its end "done"."""
    for s in list(streams.values()):
        s.flush()
        if s.ended and not s.outbox and s.talk is None and s.rid in streams:
            streams.pop(s.rid, None)
            s.bridge.end("done")
