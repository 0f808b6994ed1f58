"""A Qwen3 core stream as it opens, without the core thread (plain options, a fake clock's `now`)."""

from __future__ import annotations

from engine.listening import ListenerTimeline
from engine.qwen3.generate import SamplingParams
from engine.qwen3.serving.core_stream import Open, StreamOptions, TextLedger, open_stream


def opened(now: float, listener_buffer_s: float | None) -> ListenerTimeline | None:
    opts = StreamOptions("ryan", "english", None, 24000, SamplingParams(), listener_buffer_s=listener_buffer_s)
    cmd = Open(1, opts, bridge=None, ledger=TextLedger())  # type: ignore[arg-type]
    return open_stream(cmd, now, 24000, voices=None).before  # type: ignore[arg-type]


def test_a_continuations_earlier_audio_runs_out_on_the_cores_clock_when_the_gateway_said() -> None:
    # The gateway says how many seconds its listener still hears (clocks differ between processes); the
    # core makes that a timeline on its own clock as the stream opens, as the CPU engine does.
    assert opened(100.0, 1.5) == ListenerTimeline(101.5)
    assert opened(100.0, 0.0) == ListenerTimeline(100.0)


def test_a_stream_opened_while_its_listener_hears_nothing_has_no_audio_before_it() -> None:
    assert opened(100.0, None) is None
