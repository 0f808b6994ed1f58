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
# Resampler: engine/resample.py's, for the gateway's rate changes
__all__ = ["FILE_FORMATS", "MEDIA_TYPES", "MP3_RATES", "OPUS_RATES", "STREAM_FORMATS", "Mp3Stream", "Resampler",
           "WholeFile", "encode_file", "encode_frames", "mp3_available", "wav_header", "wav_stream_header"]  # fmt: skip


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


WAV_HEADER_BYTES = 44


def wav_header(rate: int, data_bytes: int) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV file holding `data_bytes` of samples."""
    return (
        b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data" + struct.pack("<I", data_bytes)
    )  # fmt: skip


class WholeFile:
    """One file's audio as it is made. WAV and raw PCM are written as the audio comes, so the file is the
    only copy held; the compressed formats keep the PCM and concatenate it once, to encode it."""

    def __init__(self, rate: int, fmt: str) -> None:
        self.rate, self.fmt = rate, fmt
        self.samples = 0
        self._head = WAV_HEADER_BYTES if fmt == "wav" else 0  # its sizes written once the audio is all in
        self._written: bytearray | None = bytearray(self._head) if fmt in ("wav", "pcm") else None
        self._parts: list[np.ndarray] = []

    def add(self, pcm: np.ndarray) -> None:
        self.samples += pcm.size
        if self._written is not None:
            self._written += pcm.astype("<i2", copy=False).tobytes()
        else:
            self._parts.append(pcm)

    def finish(self) -> tuple[bytes, np.ndarray]:
        """The encoded file and its PCM (a view of the file where it can be); what was held is let go.
        CPU work: call it off the event loop."""
        if self._written is not None:
            if self._head:
                self._written[: self._head] = wav_header(self.rate, len(self._written) - self._head)
            data, self._written = bytes(self._written), bytearray()
            return data, np.frombuffer(data, "<i2", offset=self._head)
        pcm = np.concatenate(self._parts) if self._parts else np.zeros(0, np.int16)
        self._parts = []
        return encode_file(pcm, self.rate, self.fmt), pcm


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


MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # MPEG-1/2/2.5 Layer III


class Mp3Stream:
    """MP3 frames as the PCM comes (LAME through `lameenc`, a 190 kB wheel of the cpu extra), for streamed
    MP3 (ElevenLabs' `mp3_22050_32`): a file encoded per chunk would restart the encoder and click at
    every seam. LAME holds back up to a frame and a half (~1.5 k samples); `finish` gives the rest."""

    def __init__(self, rate: int, kbps: int) -> None:
        import lameenc

        if rate not in MP3_RATES:
            raise ValueError(f"MP3 cannot be encoded at {rate} Hz")
        self._encoder = lameenc.Encoder()
        self._encoder.set_in_sample_rate(rate)
        self._encoder.set_channels(1)
        self._encoder.set_bit_rate(kbps)
        self._encoder.set_quality(7)  # LAME's "fast": the quality gain past it is not worth the CPU at speech rates

    def feed(self, pcm: bytes) -> bytes:
        """s16le mono PCM in; whatever whole MP3 frames it completes out (often none for a short chunk)."""
        return bytes(self._encoder.encode(pcm)) if pcm else b""

    def finish(self) -> bytes:
        return bytes(self._encoder.flush())


def mp3_available() -> bool:
    try:
        import lameenc  # noqa: F401
    except ImportError:
        return False
    return True
