"""An engine proxy that records the text each stream is given: what the listener hears, after the
gateway's segmentation and normalisation."""

from __future__ import annotations

from typing import Any


class RecordingStream:
    def __init__(self, stream: Any, appended: list[str]) -> None:
        self._stream, self._appended = stream, appended

    def append(self, text: str) -> None:
        self._appended.append(text.strip())
        self._stream.append(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class RecordingEngine:
    """The real engine; each stream's appended text recorded in `appended` (all streams, in order)."""

    def __init__(self, engine: Any) -> None:
        self._engine, self.appended = engine, []

    def open_stream(self, voice: str | None, language: str, **options: object) -> Any:
        return RecordingStream(self._engine.open_stream(voice, language, **options), self.appended)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
