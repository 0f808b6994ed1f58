"""Streamed-text WebSocket load harness for a running voxgate gateway: first audio and gaps under an LLM's traffic.

    python bench/load.py --url http://127.0.0.1:8000 --rates 0.5,1,2 --duration 20 --json out.json

Each *response* is one LLM reply: its text goes out in word pieces (English) or one-to-two-character
tokens (Mandarin) at `--units-per-s`, paced against absolute deadlines, on a warm WebSocket session.
Responses arrive open-loop as a Poisson process at each rate (or closed-loop with `--concurrency`),
in three modes run side by side with the same arrival schedule and texts:

- `none`: `split_granularity=none`, synthesis only at `input.done` (vLLM-Omni's default);
- `sentence`: independent per-sentence requests, vLLM-Omni's sentence splitter run on the client and
  each sentence sent as its own utterance (vLLM-Omni's sentence mode);
- `auto`: voxgate streaming the text into one utterance with `split_granularity=auto`.

Every audio frame's arrival time and size is recorded. Per mode and rate it reports time to first
audio from the first and from the last text unit (p50/p95/p99), audible TTFA (first sustained RMS
onset), underruns and stall time of a player that starts at the first audible sample and pauses when
dry, vLLM-Omni's never-pausing continuity rule side by side, audio seconds asked for vs produced per
second, in-flight counts, errors, the capacity knee, and ratios of the peers' modes to `auto`.
Writes JSON and a PNG plot (matplotlib: `pip install 'voxgate[bench]'`). Loopback targets only;
every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import math
import os
import random
import re
import socket
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from audio_metrics import (
    OnsetTracker,
    PlayerStats,
    continuity,
    find_knee,
    frame_of_sample,
    pausing_player,
    ratio,
    summarize,
)
from segmentation_peers import VllmOmni
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parents[1]
OWN_TEXTS = REPO / "bench" / "data" / "paragraphs.jsonl"
CORPUS = REPO.parent / "shared" / "corpus" / "segmentation_cases.jsonl"
CORPUS_COPY = REPO / "tests" / "data" / "segmentation_cases.jsonl"  # for checkouts without ../shared
MODES = ("none", "sentence", "auto")
WS_PATH = "/v1/audio/speech/stream"
API_KEY: list[str | None] = [None]  # set once from --api-key; sent as a bearer token
# set once from --session-language: what session.config says ("auto": voxgate's default and what clients that
# name no language get); None: each text's own language
SESSION_LANGUAGE: list[str | None] = [None]
# Error codes that are an explicit refusal (admission: a full queue, or HTTP 429), not a failure: the
# response was turned away before it played, so it is counted apart and not judged for gaps.
REFUSAL_CODES = frozenset({"queue_full", "http_429"})
# Seconds of speech per character, to estimate the audio asked for when a text never completed.
SPEECH_S_PER_CHAR = {"en": 1 / 14.0, "zh": 1 / 4.5}


# -- texts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    id: str
    lang: str
    text: str


_HAN = "\u3400-\u4dbf\u4e00-\u9fff"
_PIECE = re.compile(rf"[{_HAN}]{{1,2}}|[^\s{_HAN}]+\s*|\s+")


def llm_pieces(text: str) -> list[str]:
    """Split text into the units an LLM streams: a word with its trailing space, or one or two Han
    characters (a typical Mandarin token); punctuation rides with the word before it."""
    pieces = _PIECE.findall(text)
    assert "".join(pieces) == text
    return pieces


def load_texts(sources: Sequence[str], languages: Sequence[str]) -> list[Text]:
    files = {"own": OWN_TEXTS, "corpus": CORPUS if CORPUS.exists() else CORPUS_COPY}
    texts: list[Text] = []
    for name in sources:
        path = files[name]
        if not path.exists():
            print(f"note: {path} not found; skipping the {name} texts", file=sys.stderr)
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                if row["lang"] in languages:
                    texts.append(Text(f"{name}:{row['id']}", row["lang"], row["text"]))
    return texts


# -- one response --------------------------------------------------------------------------------


@dataclass
class Response:
    index: int
    mode: str
    text: Text
    scheduled: float  # arrival time on the run clock (s)
    t_first_text: float | None = None
    t_last_text: float | None = None
    t_done: float | None = None
    utterances_sent: int = 0
    utterances_done: int = 0
    text_finished: bool = False
    sample_rate: int = 24000
    frames: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes)
    onset: OnsetTracker | None = None
    t_first_commit: float | None = None
    t_last_commit: float | None = None  # the latest segment.committed: a stream asks admission as it commits
    refused_after_s: float | None = None  # its first error after the commit before it (a refusal's answer time)
    errors: list[str] = field(default_factory=list)
    refusal_bounds: list[str] = field(default_factory=list)
    # Per utterance of the response, in order: when its `input.done` went out, and the index in `frames` of
    # its first frame (absent: no audio). They tell a gap the server left from one the client's late
    # text left (`stall_causes`).
    sent_at: list[float] = field(default_factory=list)
    first_frame: dict[int, int] = field(default_factory=dict)
    timings: dict[int, dict[str, Any]] = field(default_factory=dict)  # per utterance: session.done's `timing`
    cancelled: bool = False
    timed_out: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ok(self) -> bool:
        return self.t_done is not None and not self.errors and bool(self.frames)

    @property
    def refused(self) -> bool:
        """Some of it was refused (queue_full, 429) and nothing else went wrong: admission said no."""
        return bool(self.errors) and all(e in REFUSAL_CODES for e in self.errors)

    def audio_seconds(self) -> float:
        return sum(n for _, n in self.frames) / 2 / self.sample_rate

    def played_out_at(self) -> float | None:
        """When (run clock) a player that starts at the first frame and pauses when dry has played it all."""
        end: float | None = None
        for arrival, n in self.frames:
            end = max(end if end is not None else arrival, arrival) + n / 2 / self.sample_rate
        return end


async def until_heard(r: Response, clock: Clock) -> None:
    """Wait until a player that starts at `r`'s first frame has played it all: a session's next reply
    comes then, as an agent's next turn does. Sooner, the gateway rightly treats it as a continuation
    (its audio plays after this reply's: due by then), while this harness plays every reply on its own
    from its first frame (the tenants mode did: gaps of 25-300 ms that no listener would hear)."""
    if (end := r.played_out_at()) is not None:
        await clock.sleep_until(end)


class Session:
    """One warm WebSocket session (a conversation); it carries one response at a time."""

    def __init__(self, ws: ClientConnection, mode: str, lang: str, sample_rate: int, clock: Clock) -> None:
        self.ws = ws
        self.mode = mode
        self.lang = lang
        self.sample_rate = sample_rate
        self.clock = clock
        self.current: Response | None = None
        self.broken = False
        self.orphan_frames = 0
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(
        cls, ws_url: str, mode: str, lang: str, voice: str | None, clock: Clock, key: str | None = None
    ) -> Session:
        key = key or API_KEY[0]  # a tenant's own key (the tenants mode), else --api-key
        headers = {"Authorization": f"Bearer {key}"} if key else None
        ws = await connect(ws_url, compression=None, max_size=2**24, open_timeout=10, additional_headers=headers)
        config: dict[str, Any] = {
            "type": "session.config", "language": SESSION_LANGUAGE[0] or lang, "response_format": "pcm",
            "stream_audio": True,
            "split_granularity": "auto" if mode == "auto" else "none",
        }  # fmt: skip
        if voice:
            config["voice"] = voice
        try:
            await ws.send(json.dumps(config))
            async with asyncio.timeout(10):
                while True:
                    msg = await ws.recv()
                    if isinstance(msg, str):
                        ev = json.loads(msg)
                        if ev["type"] == "session.ready":
                            return cls(ws, mode, lang, int(ev.get("sample_rate") or 24000), clock)
                        if ev["type"] == "error":
                            raise RuntimeError(f"session.config refused: {ev.get('code')}: {ev.get('message')}")
        except BaseException:
            await ws.close()
            raise

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                now = self.clock.now()
                r = self.current
                if isinstance(msg, bytes):
                    if r is None or r.cancelled:
                        self.orphan_frames += 1
                        continue
                    r.frames.append((now, len(msg)))
                    if r.onset is not None:
                        r.onset.feed(np.frombuffer(msg, dtype="<i2"))
                    continue
                ev = json.loads(msg)
                if r is None:
                    continue
                kind = ev.get("type")
                if kind == "segment.committed":
                    r.t_first_commit = now if r.t_first_commit is None else r.t_first_commit
                    r.t_last_commit = now
                elif kind == "audio.start":
                    # Audio never interleaves, so this is the utterance after the ones already done.
                    r.first_frame.setdefault(r.utterances_done, len(r.frames))
                    if ev.get("sample_rate"):
                        r.sample_rate = int(ev["sample_rate"])
                elif kind == "error":
                    if not r.errors and r.t_last_commit is not None:
                        r.refused_after_s = now - r.t_last_commit
                    r.errors.append(str(ev.get("code", "error")))
                    if ev.get("bound"):  # which queue refused it (queue_full)
                        r.refusal_bounds.append(str(ev["bound"]))
                elif kind == "session.done":
                    if isinstance(ev.get("timing"), dict):
                        r.timings[r.utterances_done] = ev["timing"]
                    r.utterances_done += 1
                    self._maybe_done(r, now)
        except ConnectionClosed:
            pass
        finally:
            self.broken = True
            if self.current is not None and not self.current.done.is_set():
                self.current.errors.append("connection_closed")
                self.current.done.set()

    def _maybe_done(self, r: Response, now: float) -> None:
        if r.text_finished and r.utterances_done >= r.utterances_sent and not r.done.is_set():
            r.t_done = now
            r.done.set()

    async def run(self, r: Response, units_per_s: float, timeout: float, onset_dbfs: float) -> None:
        """Stream one response's text as an LLM would, then wait for all of its audio."""
        self.current = r
        r.sample_rate = self.sample_rate
        r.onset = OnsetTracker(self.sample_rate, threshold_dbfs=onset_dbfs)
        pieces = llm_pieces(r.text.text)
        splitter = VllmOmni("sentence") if self.mode == "sentence" else None
        sent_upto = 0  # sentence mode: characters already sent as whole sentences
        buf = ""
        start = self.clock.now()
        try:
            for i, piece in enumerate(pieces):
                # Absolute deadlines: a slow send never shifts the rest of the text later.
                await self.clock.sleep_until(start + i / units_per_s)
                now = self.clock.now()
                if r.t_first_text is None:
                    r.t_first_text = now
                buf += piece
                if splitter is None:
                    await self.ws.send(json.dumps({"type": "input.text", "text": piece}))
                else:
                    for end in splitter.feed(piece):
                        await self._send_utterance(r, buf[sent_upto:end])
                        sent_upto = end
            if splitter is not None:
                for end in splitter.flush():
                    if end > sent_upto:
                        await self._send_utterance(r, buf[sent_upto:end])
                        sent_upto = end
            else:
                await self.ws.send(json.dumps({"type": "input.done"}))
                r.sent_at.append(self.clock.now())
                r.utterances_sent = 1
            r.t_last_text = self.clock.now()
            r.text_finished = True
            self._maybe_done(r, r.t_last_text)
            async with asyncio.timeout(max(0.1, timeout - (self.clock.now() - start))):
                await r.done.wait()
        except TimeoutError:
            r.timed_out = True
            r.errors.append("timeout")
            self.broken = True  # its audio may still come: never reuse this session
        except ConnectionClosed:
            r.errors.append("connection_closed")
            self.broken = True
        finally:
            self.current = None

    async def _send_utterance(self, r: Response, text: str) -> None:
        if not text.strip():
            return
        await self.ws.send(json.dumps({"type": "input.text", "text": text}))
        await self.ws.send(json.dumps({"type": "input.done"}))
        r.sent_at.append(self.clock.now())
        r.utterances_sent += 1

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 2)
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


# -- one run: a mode at one load level ----------------------------------------------------------


@dataclass
class RunSpec:
    mode: str
    rate: float | None  # responses/s, open loop
    concurrency: int | None  # sessions, closed loop


class Pool:
    """Warm sessions per language; grows on demand up to `limit` sessions in all."""

    def __init__(self, ws_url: str, mode: str, voice: str | None, clock: Clock, limit: int) -> None:
        self.ws_url, self.mode, self.voice, self.clock, self.limit = ws_url, mode, voice, clock, limit
        self.idle: dict[str, list[Session]] = {}
        self.all: list[Session] = []
        self.connect_s: list[float] = []
        self.connect_errors: Counter[str] = Counter()
        self.opening = 0

    async def get(self, lang: str) -> Session | None:
        idle = self.idle.setdefault(lang, [])
        while idle:
            s = idle.pop()
            if not s.broken:
                return s
        if sum(1 for s in self.all if not s.broken) + self.opening >= self.limit:
            return None
        t = self.clock.now()
        self.opening += 1
        try:
            s = await Session.open(self.ws_url, self.mode, lang, self.voice, self.clock)
        except Exception as e:  # counted, reported; the arrival is lost like a refused call
            self.connect_errors[type(e).__name__] += 1
            return None
        finally:
            self.opening -= 1
        self.connect_s.append(self.clock.now() - t)
        self.all.append(s)
        return s

    def put(self, s: Session) -> None:
        if not s.broken:
            self.idle.setdefault(s.lang, []).append(s)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.all))


def poisson_schedule(rate: float, duration: float, limit: int, rng: random.Random) -> list[float]:
    """Arrival times of a Poisson process at `rate`/s over `duration` s, at most `limit` of them."""
    out: list[float] = []
    t = 0.0
    while len(out) < limit:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append(t)
    return out


async def run_one(spec: RunSpec, args: argparse.Namespace, texts: list[Text], ws_url: str) -> dict[str, Any]:
    cpu0 = time.process_time()
    busy0 = engine_busy(ws_url)
    clock = Clock()
    pool = Pool(ws_url, spec.mode, args.voice, clock, args.max_inflight)
    rng = random.Random(args.seed)  # the same schedule and texts for every mode
    by_lang: dict[str, list[Text]] = {}
    for t in texts:
        by_lang.setdefault(t.lang, []).append(t)
    langs = sorted(by_lang)

    def pick() -> Text:
        return rng.choice(by_lang[rng.choice(langs)])

    for lang in langs:  # pre-warm: agents hold their sessions open
        warm = [await pool.get(lang) for _ in range(min(args.sessions, args.max_inflight // len(langs)))]
        for s in warm:
            if s is not None:
                pool.put(s)
    responses: list[Response] = []
    shed = 0
    shed_texts: list[tuple[Text, float]] = []
    inflight: list[tuple[float, int]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def serve(r: Response, s: Session) -> None:
        try:
            await s.run(r, args.units_per_s, args.response_timeout, args.onset_dbfs)
            await until_heard(r, clock)
        finally:
            pool.put(s)

    async def arrive(text: Text, t: float) -> None:
        nonlocal shed
        s = await pool.get(text.lang)  # here, not in the arrival loop: a slow open never delays arrivals
        if s is None:
            shed += 1  # the client bound is reached: the overload is reported, not hidden
            shed_texts.append((text, t))
            return
        r = Response(len(responses), spec.mode, text, t)
        responses.append(r)
        await serve(r, s)

    async def monitor() -> None:
        while True:
            n = sum(1 for r in responses if r.t_first_text is not None and not r.done.is_set() and not r.timed_out)
            inflight.append((round(clock.now(), 3), n))
            await asyncio.sleep(0.1)

    mon = asyncio.create_task(monitor())
    clock.t0 = time.perf_counter()  # the run clock starts after the pool is warm
    try:
        if spec.rate is not None:
            for t in poisson_schedule(spec.rate, args.duration, args.max_requests, rng):
                text = pick()
                await clock.sleep_until(t)
                task = asyncio.create_task(arrive(text, t))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        else:
            assert spec.concurrency is not None

            async def worker() -> None:
                while clock.now() < args.duration and len(responses) < args.max_requests:
                    text = pick()
                    s = await pool.get(text.lang)
                    if s is None:
                        await asyncio.sleep(0.1)
                        continue
                    r = Response(len(responses), spec.mode, text, clock.now())
                    responses.append(r)
                    await serve(r, s)

            workers = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
            async with asyncio.timeout(args.duration + args.response_timeout + 5):
                await asyncio.gather(*workers)
        if tasks:
            await asyncio.wait(set(tasks), timeout=args.drain)
        for task in list(tasks):  # still running past the drain bound: counted as timeouts
            task.cancel()
        for r in responses:
            if not r.done.is_set() and not r.timed_out:
                r.timed_out = True
                r.errors.append("timeout")
        wall = clock.now()
    finally:
        mon.cancel()
        await pool.close()
    result = summarize_run(spec, args, responses, shed, inflight, wall)
    result["_texts"] += [(text, None, t) for text, t in shed_texts]  # shed arrivals asked for audio too
    result["connect_s"] = summarize(pool.connect_s)
    result["connect_errors"] = dict(pool.connect_errors)
    result["orphan_frames"] = sum(s.orphan_frames for s in pool.all)
    # The harness shares the machine with the server: its own CPU share says when it is the bottleneck.
    result["client_cpu_share"] = (time.process_time() - cpu0) / max(wall, 1e-9)
    result["loadavg_1m_after"] = os.getloadavg()[0]  # other work on the machine skews every number
    result["engine_busy_share"] = busy_share(busy0, engine_busy(ws_url), wall)
    return result


def engine_busy(ws_url: str) -> tuple[float, float] | None:
    """(the engine's busy seconds so far, its workers) from the server's /metrics; None where it does
    not say (an engine without the measure, or no /metrics)."""
    base = "http" + ws_url.removeprefix("ws").split("/v1/", 1)[0]
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    # Labelled by model (the first is the default model's).
    busy = re.search(r"^voxgate_engine_busy_seconds_total(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    workers = re.search(r"^voxgate_engine_workers(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return None if busy is None or workers is None else (float(busy.group(1)), float(workers.group(1)))


def busy_share(before: tuple[float, float] | None, after: tuple[float, float] | None, wall: float) -> float | None:
    """The share of the run its engine's workers were synthesising: is admission leaving capacity idle?"""
    if before is None or after is None or wall <= 0:
        return None
    return (after[0] - before[0]) / wall / max(after[1], 1.0)


# -- reduction -----------------------------------------------------------------------------------


def response_metrics(r: Response, prebuffer_s: float) -> dict[str, Any]:
    """Per-response numbers; times are seconds on the run clock unless said otherwise."""
    out: dict[str, Any] = {
        "index": r.index, "text_id": r.text.id, "lang": r.text.lang, "scheduled": round(r.scheduled, 4),
        "utterances": r.utterances_sent, "ok": r.ok, "errors": r.errors, "timed_out": r.timed_out,
        "audio_s": round(r.audio_seconds(), 4), "refused_after_s": r.refused_after_s,
        "timings": [r.timings.get(u) for u in range(r.utterances_done)],  # each utterance's, as the server saw it
    }  # fmt: skip
    if r.t_first_text is None or not r.frames:
        return out
    arrivals = [t for t, _ in r.frames]
    nbytes = [n for _, n in r.frames]
    samples = [n // 2 for n in nbytes]
    t_first = arrivals[0]
    out["ttfa_first_s"] = t_first - r.t_first_text
    if r.t_first_commit is not None:
        # TTFA = waiting for the first commit (segmentation) + the server's synthesis after it.
        out["first_commit_s"] = r.t_first_commit - r.t_first_text
        out["commit_to_audio_s"] = t_first - r.t_first_commit
    if r.t_last_text is not None:
        out["ttfa_last_s"] = t_first - r.t_last_text  # negative: audio began before the text ended
        out["tail_s"] = arrivals[-1] - r.t_last_text
    onset = r.onset.onset if r.onset is not None else None
    k = frame_of_sample(samples, onset) if onset is not None else None
    if k is not None and onset is not None:
        out["onset_sample"] = onset
        out["audible_first_s"] = arrivals[k] - r.t_first_text
        if r.t_last_text is not None:
            out["audible_last_s"] = arrivals[k] - r.t_last_text
        player = pausing_player(arrivals, samples, r.sample_rate, start_sample=onset, prebuffer_s=prebuffer_s)
        out["underruns"] = player.underruns
        out["stall_s"] = player.stall_s
        causes = stall_causes(player, arrivals, r.first_frame, r.sent_at)
        server = [(gap, c) for (_, gap), c in zip(player.stalls, causes, strict=True) if c.server]
        out["server_underruns"] = len(server)
        out["server_stall_s"] = sum(gap for gap, _ in server)
        # Where each gap fell: seconds of audio played before it, how long it lasted (after the first
        # piece, mid-reply, at the end: each points at a different cause), whose it was, and how long
        # before the player ran dry the client had sent the utterance it waited for.
        played, stalls = 0.0, []
        for (dry_at, gap), c in zip(player.stalls, causes, strict=True):
            assert player.start_time is not None
            lead = None if c.lead_s is None else round(c.lead_s, 3)
            stalls.append([round(dry_at - player.start_time - played, 3), round(gap, 3), c.whose, lead])
            played += gap
        out["stalls"] = stalls
        if player.end_time is not None and r.t_last_text is not None:
            out["playout_end_after_text_s"] = player.end_time - r.t_last_text
    c = continuity(arrivals, nbytes, r.sample_rate)
    out["vllm_underrun_events"] = c.underrun_events
    out["vllm_max_underrun_s"] = c.max_underrun_s
    out["vllm_continuous"] = c.is_continuous
    return out


@dataclass(frozen=True)
class StallCause:
    """Whose a gap was. A gap before a later utterance's first audio whose text the client sent only
    after the player had run dry (sentence mode: an LLM still writing the next sentence) is the
    client's ("text"): no server could have filled it, and its wait is that utterance's time to first
    audio. Every other gap is the server's ("server"), however little time it had. `lead_s`: at an
    utterance's start, how long before the player ran dry its text was sent (negative: after)."""

    whose: str
    lead_s: float | None = None

    @property
    def server(self) -> bool:
        return self.whose == "server"


def stall_causes(player: PlayerStats, arrivals: Sequence[float], first_frame: dict[int, int],
                 sent_at: Sequence[float]) -> list[StallCause]:  # fmt: skip
    """Whose each of `player`'s stalls was (StallCause), from each utterance's first frame and send time."""
    starts = sorted((k, u) for u, k in first_frame.items())
    out = []
    for (dry_at, _), k in zip(player.stalls, player.resumed_by, strict=True):
        u, first = max(((u, f) for f, u in starts if f <= k), default=(0, 0))
        at_start = u >= 1 and u < len(sent_at) and arrivals[first] >= dry_at  # before u's audio began
        if not at_start:
            out.append(StallCause("server"))
            continue
        lead = dry_at - sent_at[u]
        out.append(StallCause("text" if lead <= 0 else "server", lead))
    return out


def free_share(heard: list[dict[str, Any]], underruns: str) -> float | None:
    """The share of heard responses with no gap counted in `underruns` (None: none heard)."""
    return sum(1 for m in heard if m[underruns] == 0) / len(heard) if heard else None


def summarize_run(spec: RunSpec, args: argparse.Namespace, responses: list[Response], shed: int,
                  inflight: list[tuple[float, int]], wall: float) -> dict[str, Any]:  # fmt: skip
    per = [response_metrics(r, args.prebuffer) for r in responses]
    ok = [m for m, r in zip(per, responses, strict=True) if r.ok]

    def col(key: str) -> list[float]:
        return [m[key] for m in ok if m.get(key) is not None]

    heard = [m for m in ok if "underruns" in m]
    error_codes: Counter[str] = Counter(e for r in responses for e in r.errors)
    counts = [n for _, n in inflight]
    produced = sum(r.audio_seconds() for r in responses)
    # Throughput over the arrival window (closed loop: the whole run), on the same footing as the
    # audio asked for: under capacity the two match but for the edges; past it, produced falls behind.
    window = args.duration if spec.rate is not None else wall
    in_window_s = sum(n / 2 / r.sample_rate for r in responses for t, n in r.frames if t <= window)
    result: dict[str, Any] = {
        "mode": spec.mode,
        "rate": spec.rate,
        "concurrency": spec.concurrency,
        "arrivals": len(responses) + shed,
        "started": len(responses),
        "completed": len(ok),
        "shed_client_bound": shed,
        "failed": sum(1 for r in responses if not r.ok and not r.refused),
        "refused": sum(1 for r in responses if r.refused),
        # refusal events by code and bound (queue_full:tenant, queue_full:model, queue_full:wait)
        "refusals": dict(Counter(f"{e}:{b}" if b else e for r in responses if r.refused
                                 for e, b in itertools.zip_longest(r.errors, r.refusal_bounds[:len(r.errors)]))),
        "admitted": sum(1 for r in responses if not r.refused),
        "errors": dict(error_codes),
        "achieved_rate": len(responses) / (args.duration if spec.rate is not None else max(wall, 1e-9)),
        "ttfa_first_s": summarize(col("ttfa_first_s")),
        "ttfa_last_s": summarize(col("ttfa_last_s")),
        "audible_first_s": summarize(col("audible_first_s")),
        "audible_last_s": summarize(col("audible_last_s")),
        "tail_s": summarize(col("tail_s")),
        "first_commit_s": summarize(col("first_commit_s")),
        "commit_to_audio_s": summarize(col("commit_to_audio_s")),
        "underruns_total": sum(m["underruns"] for m in heard),
        "stall_s_total": sum(m["stall_s"] for m in heard),
        "stall_s": summarize(col("stall_s")),
        "gap_free_share": free_share(heard, "underruns"),
        # The same without the gaps the client's late text left (StallCause): what the server is judged on.
        "server_gap_free_share": free_share(heard, "server_underruns"),
        "server_stall_s_total": sum(m["server_stall_s"] for m in heard),
        "vllm_continuous_share": (sum(1 for m in ok if m["vllm_continuous"]) / len(ok)) if ok else None,
        "vllm_max_underrun_s": summarize(col("vllm_max_underrun_s")),
        "vllm_underrun_events_total": sum(m["vllm_underrun_events"] for m in ok),
        "audio_produced_s": produced,
        "produced_audio_s_per_s": in_window_s / max(window, 1e-9),
        "produced_audio_s_per_wall_s": produced / max(wall, 1e-9),
        # Zero-byte binary frames carry no audio; counted because a client may mistake one for an end.
        "empty_frames": sum(1 for r in responses for _, n in r.frames if n == 0),
        "inflight_mean": statistics.fmean(counts) if counts else 0.0,
        "inflight_max": max(counts, default=0),
        "wall_s": wall,
        "responses": per,
    }
    if not args.no_frames:
        for m, r in zip(per, responses, strict=True):
            base = r.t_first_text if r.t_first_text is not None else r.scheduled
            m["frames"] = [[round(t - base, 4), n] for t, n in r.frames]
    result["by_lang"] = by_lang(per)
    result["inflight"] = inflight if not args.no_frames else []
    result["_texts"] = [(r.text, r.audio_seconds() if r.ok else None, r.scheduled) for r in responses]
    return result


def by_lang(per: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The headline numbers per language: voices differ in cost (Piper vs Kokoro, say)."""
    out: dict[str, dict[str, Any]] = {}
    for lang in sorted({m["lang"] for m in per}):
        ok = [m for m in per if m["lang"] == lang and m["ok"]]
        heard = [m for m in ok if "underruns" in m]
        out[lang] = {
            "started": sum(1 for m in per if m["lang"] == lang),
            "completed": len(ok),
            "audible_first_s": summarize([m["audible_first_s"] for m in heard]),
            "ttfa_last_s": summarize([m["ttfa_last_s"] for m in ok if "ttfa_last_s" in m]),
            "gap_free_share": free_share(heard, "underruns"),
            "server_gap_free_share": free_share(heard, "server_underruns"),
            "stall_s_total": sum(m["stall_s"] for m in heard),
        }
    return out


def add_asked(runs: list[dict[str, Any]], duration: float) -> None:
    """Audio seconds asked for per second, as listeners consume it: each arrival asks for its
    expected speech (the median that text produced whenever it completed anywhere in this
    invocation, else a per-character estimate) at 1 s per s from its arrival; what falls inside
    the window, per second of window. Produced counts audio received inside the same window, so a
    server that keeps up produces at least what is asked (it runs ahead of playback), and one past
    capacity falls behind. `asked_audio_s_total_per_s` is every arrival's whole speech instead."""
    seen: dict[Text, list[float]] = {}
    for run in runs:
        for text, secs, _ in run["_texts"]:
            if secs:
                seen.setdefault(text, []).append(secs)
    per_char: dict[str, list[float]] = {}
    for text, secs in seen.items():
        per_char.setdefault(text.lang, []).append(statistics.median(secs) / max(1, len(text.text)))
    for run in runs:
        window = duration if run["rate"] is not None else max(run["wall_s"], 1e-9)
        total = in_window = 0.0
        for text, _, at in run["_texts"]:
            if text in seen:
                expected = statistics.median(seen[text])
            else:
                rate = statistics.median(per_char[text.lang]) if per_char.get(text.lang) else None
                expected = len(text.text) * (rate or SPEECH_S_PER_CHAR.get(text.lang, 1 / 10))
            total += expected
            in_window += max(0.0, min(at + expected, window) - at)
        run["asked_audio_s_per_s"] = in_window / window
        run["asked_audio_s_total_per_s"] = total / window
        run["produced_over_asked"] = ratio(run["produced_audio_s_per_s"], run["asked_audio_s_per_s"])
        del run["_texts"]


def compare(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Knees per mode, and each peer mode against `auto` at every load level."""
    axis = "rate" if args.concurrency is None else "concurrency"
    modes: dict[str, dict[str, Any]] = {}
    for run in runs:
        modes.setdefault(run["mode"], {"points": []})["points"].append(run)
    for mode, m in modes.items():
        pts = [(p[axis], p["audible_first_s"]["p95"], p["gap_free_share"]) for p in m["points"]]
        m["knee"] = find_knee(pts, args.ttfa_target, args.gap_free_target)
        pts_last = [(p[axis], p["ttfa_last_s"]["p95"], p["gap_free_share"]) for p in m["points"]]
        m["knee_server_share"] = find_knee(pts_last, args.server_ttfa_target, args.gap_free_target)
        m["mode"] = mode
    ratios: list[dict[str, Any]] = []
    base = {p[axis]: p for p in modes.get("auto", {"points": []})["points"]}
    for mode in ("none", "sentence"):
        for p in modes.get(mode, {"points": []})["points"]:
            b = base.get(p[axis])
            if b is None:
                continue
            ratios.append({
                "mode": mode, axis: p[axis],
                "audible_first_p50": ratio(p["audible_first_s"]["p50"], b["audible_first_s"]["p50"]),
                "audible_first_p95": ratio(p["audible_first_s"]["p95"], b["audible_first_s"]["p95"]),
                "ttfa_first_p95": ratio(p["ttfa_first_s"]["p95"], b["ttfa_first_s"]["p95"]),
                "stall_s_total": ratio(p["stall_s_total"], b["stall_s_total"]),
                "gap_free_share": ratio(p["gap_free_share"], b["gap_free_share"]),
                # The raw pairs too: a ratio against zero stall time cannot be read.
                "stall_s_total_pair": [p["stall_s_total"], b["stall_s_total"]],
                "gap_free_share_pair": [p["gap_free_share"], b["gap_free_share"]],
            })  # fmt: skip
    return {"axis": axis, "modes": modes, "ratios_vs_auto": ratios}


# -- output --------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _gap_free(r: dict[str, Any]) -> str:
    """The listener's gap-free share, and the server's (without the gaps late text left) where they differ."""
    heard, server = r["gap_free_share"], r.get("server_gap_free_share", r["gap_free_share"])
    return _pct(heard) if server == heard else f"{_pct(heard)} ({_pct(server)})"


def table(runs: list[dict[str, Any]], axis: str) -> str:
    head = (f"| mode | {axis} | done/started | err | refused | TTFA first p50/p95/p99 ms | audible first p50/p95 ms | "
            "TTFA last p50/p95 ms | gap-free (server's) | stalls (s) | vLLM continuous | vLLM max deficit p95 ms | "
            "asked→produced audio s/s | in-flight mean/max | engine busy |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        tf, au, tl = r["ttfa_first_s"], r["audible_first_s"], r["ttfa_last_s"]
        asked = r.get("asked_audio_s_per_s")
        lines.append(
            f"| {r['mode']} | {r[axis]} | {r['completed']}/{r['started']} | {r['failed'] + r['shed_client_bound']} | "
            f"{r.get('refused', 0)} | {_ms(tf['p50'])}/{_ms(tf['p95'])}/{_ms(tf['p99'])} | "
            f"{_ms(au['p50'])}/{_ms(au['p95'])} | "
            f"{_ms(tl['p50'])}/{_ms(tl['p95'])} | {_gap_free(r)} | "
            f"{r['underruns_total']} ({r['stall_s_total']:.2f}) | {_pct(r['vllm_continuous_share'])} | "
            f"{_ms(r['vllm_max_underrun_s']['p95'])} | "
            f"{'-' if asked is None else f'{asked:.2f}'}→{r['produced_audio_s_per_s']:.2f} | "
            f"{r['inflight_mean']:.1f}/{r['inflight_max']} | {_pct(r.get('engine_busy_share'))} |"
        )
    return "\n".join(lines)


def table_by_lang(runs: list[dict[str, Any]], axis: str) -> str:
    lines = [f"| mode | {axis} | lang | done/started | audible first p50/p95 ms | TTFA last p50/p95 ms | "
             "gap-free (server's) | stall s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        for lang, b in (r.get("by_lang") or by_lang(r["responses"])).items():
            au, tl = b["audible_first_s"], b["ttfa_last_s"]
            lines.append(f"| {r['mode']} | {r[axis]} | {lang} | {b['completed']}/{b['started']} | "
                         f"{_ms(au['p50'])}/{_ms(au['p95'])} | {_ms(tl['p50'])}/{_ms(tl['p95'])} | "
                         f"{_gap_free(b)} | {b['stall_s_total']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def knee_lines(cmp: dict[str, Any]) -> str:
    out = []
    for mode, m in cmp["modes"].items():
        k, ks = m["knee"], m["knee_server_share"]
        def say(k: dict[str, Any]) -> str:
            if k["knee_rate"] is None:
                return "none within the tested range"
            return f"{k['knee_rate']} ({'+'.join(k['reasons'])}; last ok: {k['max_ok_rate']})"
        out.append(f"- knee {mode}: audible TTFA p95 ≤ {k['ttfa_target_s']} s & gap-free ≥ {k['gap_free_target']}: "
                   f"{say(k)}; server share (TTFA from last text p95 ≤ {ks['ttfa_target_s']} s): {say(ks)}")
    if cmp["ratios_vs_auto"]:
        out += ["", f"| peer mode ÷ auto | {cmp['axis']} | audible TTFA p50 | audible TTFA p95 | "
                "gap-free (peer vs auto) | stall s (peer vs auto) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in cmp["ratios_vs_auto"]:
        def x(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}×"

        (sp, sa), (gp, ga) = r["stall_s_total_pair"], r["gap_free_share_pair"]
        out.append(f"| {r['mode']} | {r[cmp['axis']]} | {x(r['audible_first_p50'])} | {x(r['audible_first_p95'])} | "
                   f"{_pct(gp)} vs {_pct(ga)} | {sp:.2f} vs {sa:.2f} |")  # fmt: skip
    return "\n".join(out)


def plot(cmp: dict[str, Any], args: argparse.Namespace, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("note: matplotlib not installed (pip install 'voxgate[bench]'); no plot", file=sys.stderr)
        return False
    axis = cmp["axis"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.4))
    def share(v: float | None) -> float:
        return math.nan if v is None else 100 * v

    for i, (mode, m) in enumerate(cmp["modes"].items()):
        xs = [p[axis] for p in m["points"]]
        c = f"C{i}"
        a1.plot(xs, [p["audible_first_s"]["p95"] or math.nan for p in m["points"]], "o-", color=c, label=mode)
        a2.plot(xs, [share(p["gap_free_share"]) for p in m["points"]], "o-", color=c,
                label=f"{mode} (pausing player)")  # fmt: skip
        a2.plot(xs, [share(p["vllm_continuous_share"]) for p in m["points"]], "x--", color=c, alpha=0.6,
                label=f"{mode} (vLLM-Omni rule)")  # fmt: skip
        a3.plot(xs, [p["produced_audio_s_per_s"] for p in m["points"]], "o-", color=c, label=f"{mode} produced")
        a3.plot(xs, [p.get("asked_audio_s_per_s") or math.nan for p in m["points"]], ":", color=c, alpha=0.6,
                label=f"{mode} asked")  # fmt: skip
    ticks = sorted({p[axis] for m in cmp["modes"].values() for p in m["points"]})
    for a in (a1, a2, a3):
        if len(ticks) > 2 and ticks[-1] / ticks[0] >= 4:  # geometric rate steps read best on a log axis
            a.set_xscale("log")
        a.set_xticks(ticks, [f"{t:g}" for t in ticks])
        a.minorticks_off()
    a1.axhline(args.ttfa_target, color="grey", ls=":", label="target")
    xlabel = "arrival rate (responses/s)" if axis == "rate" else "sessions (closed loop)"
    a1.set(xlabel=xlabel,
           ylabel="audible TTFA p95 from first text unit (s)", title="Time to first audible audio")  # fmt: skip
    a1.set_yscale("log")
    a1.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    a1.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    a1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a2.axhline(100 * args.gap_free_target, color="grey", ls=":")
    a2.set(xlabel=xlabel, ylabel="responses without a gap (%)", title="Gap-free share", ylim=(-5, 105))
    a3.set(xlabel=xlabel, ylabel="audio seconds per second", title="Audio asked for vs produced")
    a1.legend(fontsize=8)
    a2.legend(fontsize=7)
    a3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- two tenants (issue 14): weighted fairness under saturation ----------------------------------


@dataclass(frozen=True)
class TenantLoad:
    name: str
    key: str
    weight: float | None  # as the gateway is configured (its API-keys file); None: not told


def add_tenant_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("two tenants (weighted fairness under saturation)")
    g.add_argument("--tenants", default=None,
                   help="NAME=KEY,NAME=KEY: each tenant's API key; runs this mode instead of the rates")  # fmt: skip
    g.add_argument("--weights", default=None,
                   help="NAME=W,…: the weights the gateway's API-keys file gives, for the expected ratio")  # fmt: skip
    g.add_argument("--tenant-sessions", type=int, default=8,
                   help="closed-loop sessions per tenant, back to back (past the engine's capacity)")  # fmt: skip
    g.add_argument("--tenant-mode", default="auto", choices=MODES, help="how each tenant's responses are sent")
    g.add_argument("--solo", default=None,
                   help="the tenant that then runs alone with every tenant's sessions (default: the lightest); "
                        "'none' for no solo run")  # fmt: skip
    g.add_argument("--fair-tolerance", type=float, default=0.15, help="the share ratio's allowed relative error")
    g.add_argument("--refusal-backoff", type=float, default=0.5,
                   help="seconds a session waits after a refused or failed response before the next")  # fmt: skip


def parse_tenants(args: argparse.Namespace) -> list[TenantLoad]:
    def pairs(spec: str, what: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            name, sep, value = item.partition("=")
            if not sep or not name.strip() or not value.strip():
                raise SystemExit(f"--{what} entries look like NAME=VALUE, not {item[:12]!r}…")
            out[name.strip()] = value.strip()
        return out

    keys = pairs(args.tenants, "tenants")
    weights = {k: float(v) for k, v in pairs(args.weights or "", "weights").items()}
    if len(keys) < 2:
        raise SystemExit("--tenants needs at least two tenants (NAME=KEY,NAME=KEY)")
    if stray := set(weights) - set(keys):
        raise SystemExit(f"--weights names tenants not in --tenants: {sorted(stray)}")
    if any(w <= 0 for w in weights.values()) or args.tenant_sessions < 1:
        raise SystemExit("weights and --tenant-sessions must be positive")
    return [TenantLoad(name, key, weights.get(name)) for name, key in keys.items()]


async def tenant_worker(t: TenantLoad, args: argparse.Namespace, texts: list[Text], ws_url: str, clock: Clock,
                        rng: random.Random, out: list[Response], errors: Counter[str]) -> None:  # fmt: skip
    """One session of a tenant, closed loop: a response, then the next, until the window ends. A broken
    session is reopened; a refused response (queue_full) is counted, and the next waits a moment."""
    session: Session | None = None
    try:
        while clock.now() < args.duration and len(out) < args.max_requests:
            text = rng.choice(texts)
            if session is None or session.broken or session.lang != text.lang:
                if session is not None:
                    await session.close()
                try:
                    session = await Session.open(ws_url, args.tenant_mode, text.lang, args.voice, clock, key=t.key)
                except Exception as e:  # counted; the session tries again after the backoff
                    session = None
                    errors[f"connect:{type(e).__name__}"] += 1
                    await asyncio.sleep(args.refusal_backoff)
                    continue
            r = Response(len(out), args.tenant_mode, text, clock.now())
            out.append(r)
            await session.run(r, args.units_per_s, args.response_timeout, args.onset_dbfs)
            if r.errors:
                await asyncio.sleep(args.refusal_backoff)  # a refusal answered at once must not spin
            else:
                await until_heard(r, clock)
    finally:
        if session is not None:
            await session.close()


def served_in_window(responses: list[Response], window: float) -> float:
    """Audio seconds received inside the window: what the server gave this tenant while all competed."""
    return sum(n / 2 / r.sample_rate for r in responses for t, n in r.frames if t <= window)


async def run_tenants(tenants: list[TenantLoad], args: argparse.Namespace, texts: list[Text], ws_url: str,
                      label: str, sessions: int) -> dict[str, Any]:  # fmt: skip
    """Every tenant's `sessions` closed-loop sessions at once for the window; served audio per tenant."""
    clock = Clock()
    got: dict[str, list[Response]] = {t.name: [] for t in tenants}
    errs: dict[str, Counter[str]] = {t.name: Counter() for t in tenants}
    workers = [
        tenant_worker(t, args, texts, ws_url, clock, random.Random(f"{t.name}:{i}:{args.seed}"), got[t.name],
                      errs[t.name])
        for t in tenants
        for i in range(sessions)
    ]
    busy0 = engine_busy(ws_url)
    try:
        async with asyncio.timeout(args.duration + args.response_timeout + args.drain + 10):
            await asyncio.gather(*workers)
    except TimeoutError:  # every response has its own timeout; this bounds the run as a whole
        pass
    wall = clock.now()
    busy = busy_share(busy0, engine_busy(ws_url), wall)
    per: dict[str, Any] = {}
    for t in tenants:
        spec = RunSpec(args.tenant_mode, None, sessions)
        s = summarize_run(spec, args, got[t.name], 0, [], wall)
        s["gapped"] = [m for m in s["responses"] if m.get("underruns")]  # where the gaps were, and whose
        del s["_texts"], s["responses"], s["inflight"]
        s["errors"] = dict(Counter(s["errors"]) + errs[t.name])
        s["weight"] = t.weight
        s["served_audio_s"] = served_in_window(got[t.name], args.duration)
        s["served_audio_s_per_s"] = s["served_audio_s"] / args.duration
        per[t.name] = s
    total = sum(p["served_audio_s"] for p in per.values())
    for p in per.values():
        p["share"] = p["served_audio_s"] / total if total else None
    return {"run": label, "tenants": per, "served_audio_s_total": total,
            "served_audio_s_per_s_total": total / args.duration, "wall_s": wall,
            "engine_busy_share": busy}  # fmt: skip


def fairness(shared: dict[str, Any], solo: dict[str, Any] | None, tenants: list[TenantLoad],
             tolerance: float) -> dict[str, Any]:  # fmt: skip
    """The served ratio of the first tenant to each other one, against their weights' ratio; and
    the solo tenant's throughput against the pair's total (a lone tenant should get all of it)."""
    out: dict[str, Any] = {"pairs": [], "tolerance": tolerance}
    first = tenants[0]
    a = shared["tenants"][first.name]["served_audio_s"]
    for t in tenants[1:]:
        b = shared["tenants"][t.name]["served_audio_s"]
        served = a / b if b else None
        expected = first.weight / t.weight if first.weight and t.weight else None
        error = None if served is None or expected is None else served / expected - 1
        ok = None if error is None else abs(error) <= tolerance
        out["pairs"].append({"tenants": [first.name, t.name], "served_ratio": served, "weight_ratio": expected,
                             "relative_error": error, "ok": ok})  # fmt: skip
    if solo is not None:
        (name, s), = solo["tenants"].items()
        together = shared["served_audio_s_per_s_total"]
        out["solo"] = {"tenant": name, "served_audio_s_per_s": s["served_audio_s_per_s"],
                       "shared_total_audio_s_per_s": together,
                       "solo_over_shared_total": ratio(s["served_audio_s_per_s"], together)}  # fmt: skip
    return out


def tenants_table(result: dict[str, Any]) -> str:
    head = ("| run | tenant | weight | sessions | done/started | refused (bound) | failed | served audio s | "
            "audio s/s | share | audible TTFA p50/p95 ms | gap-free |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in result["runs"]:
        for name, p in run["tenants"].items():
            au = p["audible_first_s"]
            bounds = ", ".join(f"{k.partition(':')[2] or k} {v}" for k, v in sorted(p.get("refusals", {}).items()))
            lines.append(f"| {run['run']} | {name} | {p['weight'] if p['weight'] is not None else '?'} | "
                         f"{p['concurrency']} | {p['completed']}/{p['started']} | "
                         f"{p.get('refused', 0)}{f' ({bounds})' if bounds else ''} | {p['failed']} | "
                         f"{p['served_audio_s']:.1f} | {p['served_audio_s_per_s']:.2f} | {_pct(p['share'])} | "
                         f"{_ms(au['p50'])}/{_ms(au['p95'])} | {_pct(p['gap_free_share'])} |")  # fmt: skip
    for run in result["runs"]:
        if run.get("engine_busy_share") is not None:
            lines.append(f"- {run['run']}: the engine's workers were busy {_pct(run['engine_busy_share'])} of the run")
    f = result["fairness"]
    for pair in f["pairs"]:
        a, b = pair["tenants"]
        served = "-" if pair["served_ratio"] is None else f"{pair['served_ratio']:.2f}"
        if pair["weight_ratio"] is None:
            lines.append(f"- served {a}:{b} = {served} (weights not given: --weights)")
        else:
            verdict = "ok" if pair["ok"] else "OUTSIDE"
            lines.append(f"- served {a}:{b} = {served}, weights {pair['weight_ratio']:.2f}: "
                         f"{100 * pair['relative_error']:+.0f} % ({verdict}, "
                         f"tolerance ±{100 * f['tolerance']:.0f} %)")  # fmt: skip
    if solo := f.get("solo"):
        x = solo["solo_over_shared_total"]
        lines.append(f"- {solo['tenant']} alone: {solo['served_audio_s_per_s']:.2f} audio s/s = "
                     f"{'-' if x is None else f'{x:.2f}×'} the tenants' total together "
                     f"({solo['shared_total_audio_s_per_s']:.2f})")  # fmt: skip
    return "\n".join(lines)


async def prepare_target(ws_url: str, http_base: str, args: argparse.Namespace) -> tuple[str, list[str], list[Text]]:
    """Wait for the server, find which of the wanted languages it speaks, and load the texts for them."""
    model = wait_healthy(http_base, args.wait_ready)
    wanted = ["en", "zh"] if args.languages == "auto" else args.languages.split(",")
    langs = await probe_languages(ws_url, args.voice, wanted)
    if not langs:
        raise SystemExit("the server accepted none of the languages " + ",".join(wanted))
    texts = load_texts(args.texts, langs)
    if not texts:
        raise SystemExit("no texts to send")
    return model, langs, texts


async def tenants_main_async(args: argparse.Namespace) -> dict[str, Any]:
    tenants = parse_tenants(args)
    ws_url, http_base = loopback_only(args.url)
    API_KEY[0] = tenants[0].key  # the probe and the warm-up speak as the first tenant
    model, langs, texts = await prepare_target(ws_url, http_base, args)
    solo_name = args.solo
    if solo_name is None:  # the lightest tenant alone is the telling case: its weight must not cap it
        weighted = any(t.weight for t in tenants)
        solo_name = min(tenants, key=lambda t: t.weight or 1.0).name if weighted else tenants[-1].name
    if solo_name != "none" and solo_name not in {t.name for t in tenants}:
        raise SystemExit(f"--solo {solo_name!r} is not one of --tenants")
    runs_total = 1 + (solo_name != "none")
    bound = runs_total * (args.duration + args.response_timeout + args.drain + 10)
    print(f"voxgate load (tenants): model {model or '?'}, tenants {[t.name for t in tenants]} × "
          f"{args.tenant_sessions} sessions, {runs_total} runs, at most ~{bound:.0f} s", file=sys.stderr)  # fmt: skip
    await warm_up(ws_url, args.voice, texts, args)
    runs = [await run_tenants(tenants, args, texts, ws_url, "together", args.tenant_sessions)]
    solo = None
    if solo_name != "none":
        await asyncio.sleep(1.0)  # let the first run's streams leave the engine
        # Alone it offers what all the tenants offered together: the same load, one key.
        alone = [t for t in tenants if t.name == solo_name]
        solo = await run_tenants(alone, args, texts, ws_url, "alone", args.tenant_sessions * len(tenants))
        runs.append(solo)
    return {
        "url": args.url, "model": model, "languages": langs, "mode": "tenants",
        "settings": {k: v for k, v in vars(args).items() if k not in ("url", "api_key", "tenants")},
        "runs": runs, "fairness": fairness(runs[0], solo, tenants, args.fair_tolerance),
    }  # fmt: skip


def tenants_main(args: argparse.Namespace) -> int:
    result = asyncio.run(tenants_main_async(args))
    print(tenants_table(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
        print(f"json: {args.json_path}", file=sys.stderr)
    return 0


# -- setup ---------------------------------------------------------------------------------------


def loopback_only(url: str) -> tuple[str, str]:
    """(ws URL, http base) for a loopback http(s)/ws(s) URL; anything else is refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise SystemExit(f"--url must look like http://127.0.0.1:8000, not {url!r}")
    port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(parts.hostname, port)}
    except OSError as e:
        raise SystemExit(f"cannot resolve {parts.hostname}: {e}") from None
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise SystemExit(f"{parts.hostname} is not a loopback address ({sorted(addrs)}): this harness only "
                         "loads servers on this machine")  # fmt: skip
    secure = parts.scheme in ("https", "wss")
    netloc = parts.netloc
    return f"{'wss' if secure else 'ws'}://{netloc}{WS_PATH}", f"{'https' if secure else 'http'}://{netloc}"


def wait_healthy(http_base: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(http_base + "/health", timeout=2) as resp:
                body = json.loads(resp.read() or b"{}")
                return str(body.get("model", ""))
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    raise SystemExit(f"{http_base}/health did not answer 200 within {timeout:g} s ({last})")


async def probe_languages(ws_url: str, voice: str | None, wanted: Sequence[str]) -> list[str]:
    ok = []
    for lang in wanted:
        try:
            s = await Session.open(ws_url, "none", lang, voice, Clock())
        except Exception as e:
            print(f"note: language {lang} not served ({e}); skipped", file=sys.stderr)
            continue
        await s.close()
        ok.append(lang)
    return ok


async def warm_up(ws_url: str, voice: str | None, texts: list[Text], args: argparse.Namespace) -> None:
    """One unmeasured response per language: first-use costs are not load."""
    for lang in sorted({t.lang for t in texts}):
        s = await Session.open(ws_url, "auto", lang, voice, Clock())
        text = next(t for t in texts if t.lang == lang)
        await s.run(Response(-1, "warmup", text, 0.0), 1000.0, args.response_timeout, args.onset_dbfs)
        await s.close()


def specs(args: argparse.Namespace) -> Iterator[RunSpec]:
    for mode in args.modes:
        if args.concurrency is not None:
            for c in args.concurrency:
                yield RunSpec(mode, None, c)
        else:
            for rate in args.rates:
                yield RunSpec(mode, rate, None)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (loopback only)")
    p.add_argument("--rates", default="0.5,1,2", help="open-loop Poisson arrival rates, responses/s")
    p.add_argument("--concurrency", default=None,
                   help="closed loop instead: this many sessions sending back to back, e.g. 1,2,4")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per rate and mode")
    p.add_argument("--json", dest="json_path", default=None, help="write the full results here")
    p.add_argument("--plot", default=None, help="PNG path (default: beside --json)")
    p.add_argument("--modes", default=",".join(MODES), help="any of none,sentence,auto")
    p.add_argument("--languages", default="auto", help="en,zh or auto (those the server accepts)")
    p.add_argument("--texts", default="own,corpus", help="own (bench/data) and/or corpus (../shared/corpus)")
    p.add_argument("--voice", default=None)
    p.add_argument("--session-language", default=None,
                   help="what each session.config names (auto: the server reads it from the text); default: the text's")
    p.add_argument("--api-key", default=os.environ.get("VOXGATE_API_KEY"), help="for a gateway run with --api-keys")
    p.add_argument("--units-per-s", type=float, default=20.0, help="LLM text pace, word/token pieces per second")
    p.add_argument("--sessions", type=int, default=4, help="warm sessions per language opened before arrivals")
    p.add_argument("--max-inflight", type=int, default=64,
                   help="most sessions at once (each held until its reply has played); arrivals past it are shed")
    p.add_argument("--max-requests", type=int, default=500, help="most responses per rate and mode")
    p.add_argument("--response-timeout", type=float, default=60.0)
    p.add_argument("--drain", type=float, default=30.0, help="most seconds to wait for in-flight responses")
    p.add_argument("--ttfa-target", type=float, default=1.5, help="knee: audible TTFA p95 from the first text unit")
    p.add_argument("--server-ttfa-target", type=float, default=0.5, help="knee: TTFA p95 from the last text unit")
    p.add_argument("--gap-free-target", type=float, default=0.95, help="knee: share of responses with no underrun")
    p.add_argument("--onset-dbfs", type=float, default=-40.0, help="audible onset threshold (50 ms sustained)")
    p.add_argument("--prebuffer", type=float, default=0.0, help="the pausing player's jitter buffer, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-ready", type=float, default=60.0, help="seconds to wait for /health")
    p.add_argument("--no-frames", action="store_true", help="leave per-frame arrivals out of the JSON")
    p.add_argument("--report", default=None, help="print the tables (and --plot) of a saved --json; no traffic")
    add_tenant_args(p)
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if bad := set(args.modes) - set(MODES):
        p.error(f"unknown modes {sorted(bad)}")
    args.rates = [float(x) for x in args.rates.split(",") if x]
    if args.concurrency is not None:
        args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    if any(r <= 0 for r in args.rates) or args.duration <= 0 or args.units_per_s <= 0:
        p.error("rates, duration and units-per-s must be positive")
    args.texts = [t for t in args.texts.split(",") if t]
    return args


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ws_url, http_base = loopback_only(args.url)
    API_KEY[0] = args.api_key
    SESSION_LANGUAGE[0] = args.session_language
    model, langs, texts = await prepare_target(ws_url, http_base, args)
    runs_total = len(args.modes) * len(args.concurrency or args.rates)
    bound = runs_total * (args.duration + args.drain + 5)
    print(f"voxgate load: model {model or '?'}, languages {langs}, {len(texts)} texts, {runs_total} runs, "
          f"at most ~{bound:.0f} s", file=sys.stderr)  # fmt: skip
    await warm_up(ws_url, args.voice, texts, args)
    runs = []
    for spec in specs(args):
        t = time.perf_counter()
        run = await run_one(spec, args, texts, ws_url)
        runs.append(run)
        label = f"rate {spec.rate}/s" if spec.rate is not None else f"concurrency {spec.concurrency}"
        print(f"  {spec.mode:8s} {label}: {run['completed']}/{run['started']} done, "
              f"audible TTFA p95 {_ms(run['audible_first_s']['p95'])} ms, gap-free {_gap_free(run)} "
              f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)  # fmt: skip
        await asyncio.sleep(0.5)  # let the server settle between runs
    add_asked(runs, args.duration)
    cmp = compare(runs, args)
    return {
        "url": args.url, "model": model, "languages": langs,
        "settings": {k: v for k, v in vars(args).items() if k not in ("url", "api_key")},
        "runs": runs, "knees": {m: v["knee"] for m, v in cmp["modes"].items()},
        "knees_server_share": {m: v["knee_server_share"] for m, v in cmp["modes"].items()},
        "ratios_vs_auto": cmp["ratios_vs_auto"], "axis": cmp["axis"], "_cmp": cmp,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tenants:  # weighted fairness between tenants: its own runs and table
        return tenants_main(args)
    if args.report:  # re-render a saved run: tables and plot, no traffic
        result = json.loads(Path(args.report).read_text())
        if result.get("axis") == "concurrency":
            args.concurrency = result["settings"]["concurrency"]
        cmp = compare(result["runs"], args)
    else:
        result = asyncio.run(main_async(args))
        cmp = result.pop("_cmp")
    print(table(result["runs"], cmp["axis"]))
    if len(result["languages"]) > 1:
        print()
        print(table_by_lang(result["runs"], cmp["axis"]))
    print(knee_lines(cmp))
    if args.report:
        if args.plot:
            plot(cmp, args, Path(args.plot))
        return 0
    plot_path = Path(args.plot) if args.plot else (Path(args.json_path).with_suffix(".png") if args.json_path else None)
    if plot_path is not None and plot(cmp, args, plot_path):
        result["plot"] = str(plot_path)
        print(f"plot: {plot_path}", file=sys.stderr)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
        print(f"json: {args.json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
