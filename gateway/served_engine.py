"""An engine as the gateway serves it under a model name: the streams it opens are counted, so an
unload (gateway/models.py) can wait for them to end and cut those still open when its grace runs out.

`ServedEngine` passes every call to the engine it wraps, except that `open_stream` refuses once the model
is unloading (`model_unloading`) and, after the unload, every call that needs the engine says
`model_unloaded`: connections that still hold it (a session configured for the model) learn why, and
the engine itself is no longer referenced, so its memory goes back. A cut stream ends with
`StreamEnd("error", …)` naming the unload, so its client hears an `error`, never a silence.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from typing import Any

from engine import Capacity, Engine, EngineError, Stream, StreamEnd, StreamEvent, StreamRequest


class CutStream:
    """An engine stream the unload can cut: `cut(message)` cancels it and makes its end an error."""

    def __init__(self, stream: Stream, served: ServedEngine) -> None:
        self._stream = stream
        self._served = served
        self.cut_message: str | None = None

    def append(self, text: str) -> None:
        self._stream.append(text)

    def finish(self) -> None:
        self._stream.finish()

    def cancel(self) -> None:
        self._served._ended(self)
        self._stream.cancel()

    def cut(self, message: str) -> None:
        self.cut_message = message
        self._stream.cancel()

    async def events(self) -> AsyncIterator[StreamEvent]:
        try:
            async for ev in self._stream.events():
                if self.cut_message is not None:  # cancelled by the unload: its end is an error
                    yield StreamEnd("error", self.cut_message, code="model_unloaded")
                    return
                yield ev
                if isinstance(ev, StreamEnd):
                    return
        finally:
            self._served._ended(self)


class ServedEngine:
    """`engine` under `name`, its open streams counted (`open`) and cut at an unload's end."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self._engine: Engine | None = engine
        self._sample_rate: int | None = None  # kept: a connection may ask after the unload (its last rate)
        self.unloading = False
        # Weak: a stream its caller dropped without ending it does not hold the count up for ever.
        self._open: weakref.WeakSet[CutStream] = weakref.WeakSet()

    @property
    def engine(self) -> Engine | None:
        """The engine itself (None once unloaded)."""
        return self._engine

    @property
    def sample_rate(self) -> int:
        """The engine's (an engine process declares it once warm, so it is read when asked, not before)."""
        if self._engine is not None:
            self._sample_rate = self._engine.sample_rate
        if self._sample_rate is None:
            raise EngineError("model_unloaded", f"model {self.name!r} was unloaded")
        return self._sample_rate

    @property
    def supports_cloning(self) -> bool:
        return bool(getattr(self._serving(), "supports_cloning", False))

    @property
    def open(self) -> int:
        return len(self._open)

    def _serving(self) -> Engine:
        if self._engine is None:
            raise EngineError("model_unloaded", f"model {self.name!r} was unloaded")
        return self._engine

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self._serving(), attr)

    def voices(self) -> list[Any]:
        return self._serving().voices()

    def languages(self) -> list[str]:
        return self._serving().languages()

    def codec_info(self) -> dict[str, object] | None:
        return self._serving().codec_info()

    def check(self, request: StreamRequest) -> None:
        self._serving().check(request)

    def capacity(self) -> Capacity | None:
        """The engine's capacity (None: it cannot tell, or it is gone: admission then uses its setting)."""
        probe = getattr(self._engine, "capacity", None)
        return None if probe is None else probe()

    def open_stream(self, voice: str | None, language: str, **options: object) -> Stream:
        engine = self._serving()
        if self.unloading:
            raise EngineError("model_unloading", f"model {self.name!r} is unloading: it takes no new streams")
        stream = CutStream(engine.open_stream(voice, language, **options), self)
        self._open.add(stream)
        return stream

    def _ended(self, stream: CutStream) -> None:
        self._open.discard(stream)

    def cut(self, message: str) -> int:
        """Cut every open stream; returns how many."""
        streams = list(self._open)
        for stream in streams:
            stream.cut(message)
        return len(streams)

    def release(self) -> Engine | None:
        """Forget the engine (the unload closes it); later calls say `model_unloaded`."""
        engine, self._engine = self._engine, None
        return engine

    def close(self) -> None:
        """Closing is the registry's (an unload): a caller holding this closes nothing."""
