"""What an attack on a live gateway must not disturb: a canary session that keeps speaking, a probe
that keeps asking `/health`, and the server's resident memory (from `/metrics`, the admin plane's: pass
the admin key where the server has one).

    async with Canary(url) as canary, HealthProbe(url) as health:
        rss0 = server_rss(url)
        await attack(url)
        await canary.keep_hearing(2.0)        # at least two more utterances after the attack
    canary.report().worst_wait_s, health.worst_s, server_rss(url) - rss0

The canary speaks short utterances back to back (`input.text` + `input.done`, then the next after
`session.done`). `worst_wait_s` is the longest the canary waited for the server while an utterance
was open: from `input.done` to the first message, and between any two messages after it. A frozen
event loop, a starved engine worker or audio held behind a stalled store all show there. It also
plays the audio in simulation (a player starting at the first byte, at real time, each utterance
after the one before) and sums the time that player would have run dry (`underrun_s`); the longest
single time it had nothing to play, an utterance's first audio included, is `worst_gap_s`, what its
listener heard. The two differ where the engine rightly makes a piece due when the listener runs dry:
a message 4 s after the one before, with 5 s of audio still to play, is a wait but no gap.

Until an utterance's first audio, its listener may still be hearing the one before (the server sends
audio faster than it plays): that time is no wait. The gateway tells the engine so (a continuation,
`listener_buffer_s`), and a busy engine rightly makes that audio due when the listener runs dry rather
than at once; the wait counted is from `input.done` or the end of the audio before, whichever is later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import websockets

CANARY_TEXT = "The canary keeps singing. Every reply must reach the listener without a gap."


def ws_url(url: str) -> str:
    base = url if "://" in url else f"http://{url}"
    return base.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/v1/audio/speech/stream"


def http_url(url: str) -> str:
    return (url if "://" in url else f"http://{url}").rstrip("/")


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class CanaryReport:
    utterances: int  # completed (session.done) while the canary ran
    worst_wait_s: float  # longest wait for the server within an open utterance
    underrun_s: float  # total time a real-time player would have run dry within utterances
    worst_gap_s: float  # the longest it had nothing to play, an utterance's first audio included
    audio_s: float  # audio received
    errors: list[dict[str, Any]] = field(default_factory=list)  # error events the canary got
    failure: str | None = None  # the canary's socket failed (closed, timed out)


class Canary:
    """A session speaking `text` again and again until the context exits."""

    def __init__(
        self, url: str, *, key: str | None = None, text: str = CANARY_TEXT, timeout: float = 120.0,
        **config: Any,
    ) -> None:
        self.url, self.key, self.text, self.timeout = url, key, text, timeout
        self.config = {"type": "session.config", "voice": "joe", "language": "en"} | config
        self.utterances = 0
        self.worst_wait = 0.0
        self.underrun = 0.0
        self.worst_gap = 0.0
        self.audio_s = 0.0
        self.errors: list[dict[str, Any]] = []
        self.failure: str | None = None
        self._ws: Any = None
        self._plays_until = 0.0  # when (time.monotonic) the simulated player runs out of the audio received
        self._task: asyncio.Task[None] | None = None
        self._stop = False
        self._done = asyncio.Event()

    async def __aenter__(self) -> Canary:
        self._ws = await websockets.connect(
            ws_url(self.url), max_size=None, additional_headers=auth_headers(self.key), open_timeout=30
        )
        await self._ws.send(json.dumps(self.config))
        ready = json.loads(await asyncio.wait_for(self._ws.recv(), 30))
        if ready.get("type") != "session.ready":
            raise RuntimeError(f"canary not configured: {ready}")
        self.rate = int(ready["sample_rate"])
        self._task = asyncio.create_task(self._run())
        await self.keep_hearing(1)  # the canary is speaking before the attack starts
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, self.timeout)
            self._task.cancel()
        with contextlib.suppress(Exception):
            await self._ws.close()

    async def keep_hearing(self, utterances: int = 2) -> None:
        """Wait until `utterances` more utterances completed (or the canary failed)."""
        target = self.utterances + utterances
        deadline = time.monotonic() + self.timeout * utterances
        while self.utterances < target and self.failure is None:
            if time.monotonic() > deadline:
                self.failure = f"no utterance completed in {self.timeout * utterances:g} s"
                return
            self._done.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), 1.0)

    def report(self) -> CanaryReport:
        return CanaryReport(self.utterances, round(self.worst_wait, 3), round(self.underrun, 3),
                            round(self.worst_gap, 3), round(self.audio_s, 2), list(self.errors),
                            self.failure)  # fmt: skip

    async def _run(self) -> None:
        try:
            while not self._stop:
                await self._utterance()
                self.utterances += 1
                self._done.set()
        except Exception as e:  # reported, not raised: the attack's test asserts on the report
            self.failure = f"{type(e).__name__}: {e}"
            self._done.set()

    async def _utterance(self) -> None:
        ws = self._ws
        await ws.send(json.dumps({"type": "input.text", "text": self.text}))
        await ws.send(json.dumps({"type": "input.done"}))
        last = sent = time.monotonic()
        play_start: float | None = None
        played = 0.0  # seconds of audio received in this utterance
        while True:
            msg = await asyncio.wait_for(ws.recv(), self.timeout)
            now = time.monotonic()
            since = last if play_start is not None else max(last, self._plays_until)  # the module doc
            self.worst_wait = max(self.worst_wait, now - since)
            last = now
            if isinstance(msg, bytes):
                seconds = len(msg) / 2 / self.rate
                if play_start is None:
                    self.worst_gap = max(self.worst_gap, now - max(sent, self._plays_until))
                    play_start = max(now, self._plays_until)  # after the utterance before has played
                elif now - play_start > played:  # the player ran dry before this chunk came
                    self.underrun += now - play_start - played
                    self.worst_gap = max(self.worst_gap, now - play_start - played)
                    play_start = now - played
                played += seconds
                self.audio_s += seconds
                self._plays_until = play_start + played
                continue
            ev = json.loads(msg)
            if ev["type"] == "error":
                self.errors.append(ev)
            if ev["type"] == "session.done":
                return


class HealthProbe:
    """GET /health every `interval` seconds from a thread of its own (so a busy client loop cannot
    delay it); records the worst latency and every status seen."""

    def __init__(self, url: str, interval: float = 0.05, timeout: float = 60.0) -> None:
        self.url = http_url(url) + "/health"
        self.interval, self.timeout = interval, timeout
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="health-probe")

    @property
    def worst_s(self) -> float:
        return round(max(self.latencies, default=0.0), 3)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                    status = json.load(r).get("status", "?")
            except urllib.error.HTTPError as e:
                status = str(e.code)
            except Exception as e:
                self.failures.append(f"{type(e).__name__}: {e}")
                status = "unreachable"
            self.latencies.append(time.monotonic() - t0)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self._stop.wait(self.interval)

    async def __aenter__(self) -> HealthProbe:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, self.timeout + 1)


_RSS = re.compile(r"^process_resident_memory_bytes ([0-9.e+]+)$", re.M)
_LAG = re.compile(r'^voxgate_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)$', re.M)


def _metrics(url: str, admin_key: str | None = None) -> str:
    """/metrics is the admin plane's: the admin key where the server has one (else a loopback server that
    opts in, admin_open_loopback)."""
    req = urllib.request.Request(http_url(url) + "/metrics", headers=auth_headers(admin_key))
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def server_rss(url: str, admin_key: str | None = None) -> int:
    """The server process's resident memory, from its Prometheus metrics (Linux)."""
    m = _RSS.search(_metrics(url, admin_key))
    if m is None:
        raise RuntimeError("/metrics has no process_resident_memory_bytes")
    return int(float(m.group(1)))


def loop_lag_buckets(url: str, admin_key: str | None = None) -> dict[float, float]:
    """The server's event-loop lag histogram (cumulative counts by upper bound), empty if it has none."""
    return {float(le): float(n) for le, n in _LAG.findall(_metrics(url, admin_key))}


def worst_loop_lag(before: dict[float, float], after: dict[float, float]) -> float | None:
    """An upper bound of the worst event-loop lag between two readings: the smallest bucket bound that
    no new observation exceeded (inf: one exceeded every bound; None: the server has no histogram)."""
    if not before or not after:
        return None
    total = after[float("inf")] - before[float("inf")]
    for le in sorted(after):
        if after[le] - before.get(le, 0.0) >= total:
            return le
    return float("inf")
