"""Audio at the edge: telephony companding, file encodings (resampling: engine/resample.py)."""

from __future__ import annotations

import io
import struct

import numpy as np

from engine.resample import Resampler

STREAM_FORMATS = ("pcm", "ulaw", "alaw")  # raw frames, sent as they are made
FILE_FORMATS = ("wav", "flac", "mp3", "opus", "pcm")  # one encoded file per utterance / request
MEDIA_TYPES = {
    "pcm": "audio/pcm",
    "ulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
__all__ = ["FILE_FORMATS", "MEDIA_TYPES", "OPUS_RATES", "STREAM_FORMATS", "Resampler", "encode_file", "encode_frames",
           "wav_stream_header"]  # Resampler: engine/resample.py's, for the gateway's rate changes


def _ulaw(pcm: np.ndarray) -> bytes:
    """ITU-T G.711 μ-law (the reference 14-bit algorithm)."""
    x = pcm.astype(np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), 8159) + 0x21
    seg = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), mag)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))  # 8: clipped
    return (code ^ mask).astype(np.uint8).tobytes()


def _alaw(pcm: np.ndarray) -> bytes:
    """ITU-T G.711 A-law."""
    x = pcm.astype(np.int32) >> 3  # 13-bit
    sign = np.where(x >= 0, 0x80, 0)
    mag = np.minimum(np.where(x < 0, -x - 1, x), 0xFFF)
    exponent = np.where(mag < 32, 0, np.floor(np.log2(np.maximum(mag, 1))).astype(np.int32) - 4)
    mantissa = np.where(exponent == 0, mag >> 1, mag >> exponent) & 0x0F
    return (((sign | (exponent << 4) | mantissa) ^ 0x55) & 0xFF).astype(np.uint8).tobytes()


def encode_frames(pcm: np.ndarray, fmt: str) -> bytes:
    """Raw streamed frames: s16le PCM or 8-bit G.711."""
    if fmt == "pcm":
        return pcm.astype("<i2", copy=False).tobytes()
    if fmt == "ulaw":
        return _ulaw(pcm)
    if fmt == "alaw":
        return _alaw(pcm)
    raise ValueError(f"not a streaming format: {fmt}")


def wav_stream_header(rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes at their maximum, as streaming servers do)."""
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )  # fmt: skip


def encode_file(pcm: np.ndarray, rate: int, fmt: str) -> bytes:
    """One whole file. flac/mp3/opus come from libsndfile (the soundfile wheel bundles it)."""
    if fmt == "pcm":
        return encode_frames(pcm, "pcm")
    import soundfile

    buf = io.BytesIO()
    kind, subtype = {
        "wav": ("WAV", "PCM_16"),
        "flac": ("FLAC", "PCM_16"),
        "mp3": ("MP3", "MPEG_LAYER_III"),
        "opus": ("OGG", "OPUS"),
    }[fmt]
    if fmt == "opus" and rate not in OPUS_RATES:
        pcm, rate = Resampler(rate, 48000)(pcm, last=True), 48000
    soundfile.write(buf, pcm.astype(np.int16, copy=False), rate, format=kind, subtype=subtype)
    return buf.getvalue()
