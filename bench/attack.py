"""The attack suite: each attack of issue 13 against a live gateway, with a canary session speaking
beside it and `/health` probed throughout. Prints a table and writes JSON.

    python bench/attack.py --url http://127.0.0.1:8000 [--only NAME,…] [--key KEY] [--admin-key KEY] [--json OUT.json]

Every attack is an `async def (ctx) -> dict` registered with `@attack(name)`; it returns what it saw
(the codes it got back, say). `run(url, name)` runs one with the canary and the probe and returns a
`Result` (the tests assert on it; this script prints it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import websockets
from canary import Canary, CanaryReport, HealthProbe, loop_lag_buckets, server_rss, worst_loop_lag


@dataclass
class Context:
    url: str  # http://HOST:PORT
    key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # per-attack knobs (tests shrink them)
    admin_key: str | None = None  # the admin plane's (/metrics, /v1/admin), where the server has one


Attack = Callable[[Context], Awaitable[dict[str, Any]]]
ATTACKS: dict[str, Attack] = {}


def attack(name: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = fn
        return fn

    return register


@dataclass
class Result:
    name: str
    canary: CanaryReport
    health_worst_s: float
    health_statuses: dict[str, int]
    rss_growth_mb: float
    loop_lag_s: float | None  # the server's worst event-loop lag during the attack (a bucket bound)
    seconds: float
    seen: dict[str, Any]


async def run(
    url: str, name: str, *, key: str | None = None, after: int = 2, admin_key: str | None = None, **options: Any
) -> Result:
    """Run attack `name` with a canary speaking and /health probed; `after` canary utterances must
    complete after the attack returns (the canary keeps hearing speech). `admin_key` reads the server's
    memory from /metrics (the admin plane's) where the server has an admin key."""
    ctx = Context(url, key, options, admin_key)
    t0 = time.monotonic()
    async with Canary(url, key=key) as canary, HealthProbe(url) as health:
        rss0 = await asyncio.to_thread(server_rss, url, admin_key)
        lag0 = await asyncio.to_thread(loop_lag_buckets, url, admin_key)
        seen = await ATTACKS[name](ctx)
        await canary.keep_hearing(after)
        rss1 = await asyncio.to_thread(server_rss, url, admin_key)
        lag1 = await asyncio.to_thread(loop_lag_buckets, url, admin_key)
    return Result(name, canary.report(), health.worst_s, dict(health.statuses), round((rss1 - rss0) / 2**20, 1),
                  worst_loop_lag(lag0, lag1), round(time.monotonic() - t0, 2), seen)  # fmt: skip


# -- attacks (each section names its finding in issue 13) -------------------------------------------------

# Finding 4: `split_granularity: "none"` turns a whole utterance into one segment. Two clients each send
# 64 KiB of prose as one segment and keep reading its audio; the canary must still get a worker.
def huge_prose(chars: int) -> str:
    """About `chars` characters of ordinary English sentences, every sentence different."""
    parts: list[str] = []
    size, i = 0, 0
    while True:
        s = f"Sentence {i} tells the listener about parcel {i * 7 % 1000} and why it matters today. "
        if size + len(s) > chars:
            return "".join(parts)
        parts.append(s)
        size += len(s)
        i += 1


@attack("none_mode_huge_segments")
async def none_mode_huge_segments(ctx: Context) -> dict[str, Any]:
    import websockets
    from canary import auth_headers, ws_url

    clients = int(ctx.options.get("clients", 2))
    chars = int(ctx.options.get("chars", 65000))  # one segment: `none` mode cuts past 65536
    hold_s = float(ctx.options.get("hold_s", 20.0))  # the huge utterances keep speaking this long
    text = huge_prose(chars)
    seen: dict[str, Any] = {"audio_bytes": 0, "errors": []}

    async def client() -> None:
        async with websockets.connect(ws_url(ctx.url), max_size=None, additional_headers=auth_headers(ctx.key),
                                      open_timeout=30) as ws:  # fmt: skip
            await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en",
                                      "split_granularity": "none"}))  # fmt: skip
            await asyncio.wait_for(ws.recv(), 30)
            for start in range(0, len(text), 8192):  # under the per-message limit
                await ws.send(json.dumps({"type": "input.text", "text": text[start : start + 8192]}))
            await ws.send(json.dumps({"type": "input.done"}))
            end = time.monotonic() + hold_s
            while (left := end - time.monotonic()) > 0:  # read as a fast listener would
                try:
                    msg = await asyncio.wait_for(ws.recv(), left)
                except TimeoutError:
                    break
                if isinstance(msg, bytes):
                    seen["audio_bytes"] += len(msg)
                elif (ev := json.loads(msg))["type"] == "error":
                    seen["errors"].append(ev.get("code"))
                elif ev["type"] == "session.done":
                    break

    await asyncio.gather(*(client() for _ in range(clients)))
    return seen


# Findings 5 and 7: voice registration. A clip that decodes to hours of audio (a compressed file of
# silence: 2 h at 8 kHz is ~0.2 MB of FLAC, ~1.4 GB of float32 once decoded), sent once (`voice_bomb`)
# or by many callers at once (`voice_flood`). The gateway must refuse it from the header or stop
# decoding at the 30 s limit, whatever the format. Options: format (flac | opus | vorbis | mp3 | wav),
# seconds, rate, header ("true"; "unknown": a FLAC that declares no length; "short": one that declares
# 2 s). A gateway that cannot clone refuses the clip before decoding it (`voice_cloning_unsupported`).
_BOMB_FORMATS = {"flac": ("FLAC", "PCM_16"), "opus": ("OGG", "OPUS"), "vorbis": ("OGG", "VORBIS"),
                 "mp3": ("MP3", "MPEG_LAYER_III"), "wav": ("WAV", "PCM_U8")}  # fmt: skip


def bomb_clip(fmt: str = "flac", seconds: float = 7200.0, rate: int = 8000, header: str = "true") -> bytes:
    """`seconds` of silence as an audio file, written a minute at a time (the bomb itself stays small)."""
    import io

    import numpy as np
    import soundfile

    container, subtype = _BOMB_FORMATS[fmt]
    rate = 48000 if fmt == "opus" else rate  # Opus knows 8/12/16/24/48 kHz; 48 kHz is the biggest bomb
    buf = io.BytesIO()
    with soundfile.SoundFile(buf, "w", rate, 1, format=container, subtype=subtype) as f:
        minute = np.zeros(rate * 60, np.int16)
        left = int(seconds * rate)
        while left > 0:
            f.write(minute[:left])
            left -= minute.size
    data = bytearray(buf.getvalue())
    if header != "true":
        if fmt != "flac":
            raise ValueError("a lying header is made for FLAC only")
        # STREAMINFO's total-samples field: the low 36 bits of the 8 bytes at offset 18.
        declared = 0 if header == "unknown" else 2 * rate
        field_ = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1) | declared
        data[18:26] = field_.to_bytes(8, "big")
    return bytes(data)


def _post_json(
    ctx: Context, path: str, body: dict[str, Any], timeout: float = 120.0, method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    from canary import auth_headers, http_url

    req = urllib.request.Request(http_url(ctx.url) + path, json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"} | auth_headers(ctx.key))  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}


def _delete(ctx: Context, path: str) -> None:
    import urllib.request

    from canary import auth_headers, http_url

    req = urllib.request.Request(http_url(ctx.url) + path, method="DELETE", headers=auth_headers(ctx.key))
    with urllib.request.urlopen(req, timeout=30):
        pass


class PeakRss:
    """The server's RSS sampled every `interval` s while the block runs: a freed bomb leaves the RSS
    where it was, so only the peak shows what decoding it took."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        import threading

        self.url, self.interval = url, interval
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-rss")

    @property
    def growth_mb(self) -> float:
        return round((self.peak - self.base) / 2**20, 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, server_rss(self.url))

    async def __aenter__(self) -> PeakRss:
        self.base = self.peak = await asyncio.to_thread(server_rss, self.url)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 30)
        self.peak = max(self.peak, await asyncio.to_thread(server_rss, self.url))


async def _register_bombs(ctx: Context, count: int) -> dict[str, Any]:
    import base64
    import uuid

    o = ctx.options
    fmt, header = str(o.get("format", "flac")), str(o.get("header", "true"))
    clip = await asyncio.to_thread(bomb_clip, fmt, float(o.get("seconds", 7200)), int(o.get("rate", 8000)), header)
    audio = base64.b64encode(clip).decode()
    answers: list[tuple[int, str, float]] = []

    async def one() -> None:
        voice_id = f"bomb-{uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        status, body = await asyncio.to_thread(_post_json, ctx, "/v1/audio/voices",
                                               {"voice_id": voice_id, "ref_audio": audio, "ref_text": "Silence."})
        answers.append((status, (body.get("error") or {}).get("code", ""), time.monotonic() - t0))
        if status == 201:  # accepted (what the header declared, say): leave nothing behind
            await asyncio.to_thread(_delete, ctx, f"/v1/audio/voices/{voice_id}")

    async with PeakRss(ctx.url) as rss:
        await asyncio.gather(*(one() for _ in range(count)))
    statuses: dict[str, int] = {}
    codes: dict[str, int] = {}
    for status, code, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        codes[code] = codes.get(code, 0) + 1
    return {"clip_bytes": len(clip), "statuses": statuses, "codes": codes,
            "worst_answer_s": round(max(s for *_, s in answers), 3), "rss_peak_growth_mb": rss.growth_mb}  # fmt: skip


@attack("voice_bomb")
async def voice_bomb(ctx: Context) -> dict[str, Any]:
    return await _register_bombs(ctx, 1)


@attack("voice_flood")
async def voice_flood(ctx: Context) -> dict[str, Any]:
    return await _register_bombs(ctx, int(ctx.options.get("concurrency", 16)))


# Finding 1: one deceptive message. It mentions "session.config" near its start (the old size check looked
# for that string), and with permessage-deflate a few kilobytes on the wire are megabytes of text with no
# punctuation (the segmenter's worst case). Then the same text as many in-bounds messages (`text_flood`).
async def _config_session(ctx: Context, **config: Any) -> Any:
    import websockets
    from canary import auth_headers, ws_url

    ws = await websockets.connect(ws_url(ctx.url), max_size=None, additional_headers=auth_headers(ctx.key),
                                  open_timeout=30, compression="deflate")  # fmt: skip
    await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"} | config))
    await asyncio.wait_for(ws.recv(), 30)
    return ws


async def _codes(ws: Any, seconds: float) -> list[str]:
    """The error codes a socket gets within `seconds` (audio and other events read and dropped)."""
    codes: list[str] = []
    end = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while (left := end - time.monotonic()) > 0:
            msg = await asyncio.wait_for(ws.recv(), left)
            if isinstance(msg, str) and (ev := json.loads(msg))["type"] == "error":
                codes.append(ev["code"])
    return codes


@attack("deflate_text_bomb")
async def deflate_text_bomb(ctx: Context) -> dict[str, Any]:
    chars = int(ctx.options.get("chars", 3_500_000))
    ws = await _config_session(ctx)
    wire = json.dumps({"type": "input.text", "note": "session.config", "text": "a" * chars})
    await ws.send(wire)
    codes = await _codes(ws, 3.0)
    await ws.close()
    return {"codes": codes, "message_chars": len(wire)}


@attack("text_flood")
async def text_flood(ctx: Context) -> dict[str, Any]:
    """Messages just under the 128 KiB limit, of words with no punctuation, as fast as the socket takes
    them, for `seconds`; then input.done. The gateway must segment them without holding the loop and
    refuse what exceeds the backlog bound. `script=han`: Mandarin with no mark, in a Mandarin session
    (the segmenter cuts such a run at jieba words, in pieces of 16, 32, ... characters up to max_chars)."""
    seconds = float(ctx.options.get("seconds", 5.0))
    if ctx.options.get("script", "latin") == "han":
        ws = await _config_session(ctx, voice=None, language="zh")
        words = ("我们的系统会自动根据您的使用习惯推荐最合适的套餐方案" * 2000)[: 40 * 1024]  # 3 bytes each
    else:
        ws = await _config_session(ctx)
        words = ("lorem ipsum dolor sit amet " * 5000)[: 120 * 1024]
    sent, end = 0, time.monotonic() + seconds
    reader = asyncio.create_task(_codes(ws, seconds + 5))
    wire = json.dumps({"type": "input.text", "text": words}, ensure_ascii=False)  # UTF-8: Han text fits too
    while time.monotonic() < end:
        await ws.send(wire)
        sent += 1
        await asyncio.sleep(0.01)
    await ws.send(json.dumps({"type": "input.cancel"}))
    codes = await reader
    await ws.close()
    return {"messages": sent, "codes": sorted(set(codes)), "backlog_full": codes.count("backlog_full")}


@attack("deep_nesting")
async def deep_nesting(ctx: Context) -> dict[str, Any]:
    ws = await _config_session(ctx)
    depth = int(ctx.options.get("depth", 100_000))
    await ws.send('{"type": "input.text", "x": ' + "[" * depth + "]" * depth + "}")
    await ws.send(json.dumps({"type": "session.config", "seed": 2**64}))
    await ws.send('{"type": "session.config", "speed": NaN}')
    codes = await _codes(ws, 2.0)
    still_open = ws.state.name == "OPEN"
    await ws.close()
    return {"codes": codes, "still_open": still_open}


# Findings 2 and 6: sockets that open an utterance and never finish it: they hold engine capacity (a
# parked request keeps its slot), and one that streams text forever grows the server's memory.
@attack("idle_open_utterances")
async def idle_open_utterances(ctx: Context) -> dict[str, Any]:
    n, hold = int(ctx.options.get("sockets", 32)), float(ctx.options.get("hold_s", 10.0))
    sockets = [await _config_session(ctx) for _ in range(n)]
    for ws in sockets:
        await ws.send(json.dumps({"type": "input.text", "text": "I will say more later, and "}))
    codes = await asyncio.gather(*(_codes(ws, hold) for ws in sockets))
    for ws in sockets:
        await ws.close()
    flat = [c for cs in codes for c in cs]
    return {"sockets": n, "codes": sorted(set(flat))}


@attack("endless_utterance")
async def endless_utterance(ctx: Context) -> dict[str, Any]:
    """Prose with sentence ends, 20 kB/s, never an input.done; audio read as fast as it comes."""
    seconds = float(ctx.options.get("seconds", 10.0))
    ws = await _config_session(ctx)
    sentence = "This sentence goes on and on, as the stream of text never ends. "
    reader = asyncio.create_task(_codes(ws, seconds + 2))
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        await ws.send(json.dumps({"type": "input.text", "text": sentence * 16}))
        sent += 1
        await asyncio.sleep(0.05)
    await ws.send(json.dumps({"type": "input.cancel"}))
    codes = await reader
    await ws.close()
    return {"messages": sent, "codes": sorted(set(codes))}


# The smaller findings: slowloris on the HTTP side.
@attack("slowloris")
async def slowloris(ctx: Context) -> dict[str, Any]:
    """`connections` sockets that send a header line every second and never finish; how many the server
    has closed after `hold_s`."""
    from urllib.parse import urlsplit

    n, hold = int(ctx.options.get("connections", 64)), float(ctx.options.get("hold_s", 12.0))
    parts = urlsplit(ctx.url if "://" in ctx.url else f"http://{ctx.url}")
    conns = [await asyncio.open_connection(parts.hostname, parts.port) for _ in range(n)]
    for _, w in conns:
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    closed, end = 0, time.monotonic() + hold
    while time.monotonic() < end and closed < n:
        await asyncio.sleep(1.0)
        closed = 0
        for r, w in conns:
            with contextlib.suppress(OSError):
                w.write(b"X-Slow: 1\r\n")
            if r.at_eof() or w.is_closing():
                closed += 1
                continue
            with contextlib.suppress(TimeoutError, OSError):
                if await asyncio.wait_for(r.read(1), 0.001) == b"":
                    closed += 1
    for _, w in conns:
        w.close()
    return {"connections": n, "closed_by_server": closed}


# Finding 2, the engine's side: on the Qwen engine every open utterance that has said one sentence parks
# a request in a KV slot. `sockets` of them (32: every slot) are held open for `hold_s` while the canary
# speaks; a probe session then asks for one reply and times its first audio. Options: voice (default:
# the engine's), sockets, hold_s.
@attack("parked_slots")
async def parked_slots(ctx: Context) -> dict[str, Any]:
    voice = ctx.options.get("voice")
    config = {"voice": voice} if voice else {"voice": None}
    n, hold = int(ctx.options.get("sockets", 32)), float(ctx.options.get("hold_s", 6.0))
    heard: dict[int, float] = {}
    told: set[int] = set()  # the sockets told something of their utterance: audio, a wait, or an error
    codes: list[str] = []

    async def drain(i: int, ws: Any) -> None:  # read everything, as a live client does
        with contextlib.suppress(Exception):
            async for msg in ws:
                if isinstance(msg, bytes):
                    heard.setdefault(i, time.monotonic())
                    told.add(i)
                elif (ev := json.loads(msg))["type"] in ("error", "audio.waiting"):
                    told.add(i)
                    if ev["type"] == "error":
                        codes.append(ev.get("code", "?"))

    sockets = [await _config_session(ctx, **config) for _ in range(n)]
    readers = [asyncio.create_task(drain(i, ws)) for i, ws in enumerate(sockets)]
    for ws in sockets:  # one committed sentence, then the utterance stays open
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there, I am still thinking. And"}))
    await asyncio.sleep(hold)
    probe = await _config_session(ctx, **config)
    t0 = time.monotonic()
    await probe.send(json.dumps({"type": "input.text", "text": "Is anyone there?"}))
    await probe.send(json.dumps({"type": "input.done"}))
    first_audio: float | None = None
    probe_events: list[str] = []  # what the probe was told before its audio (audio.waiting, say)
    with contextlib.suppress(TimeoutError):
        while first_audio is None:
            msg = await asyncio.wait_for(probe.recv(), max(0.1, 60 - (time.monotonic() - t0)))
            if isinstance(msg, bytes):
                first_audio = time.monotonic() - t0
            else:
                probe_events.append(json.loads(msg)["type"])
    for ws in [*sockets, probe]:
        await ws.close()
    for r in readers:
        r.cancel()
    return {"sockets": n, "sockets_heard": len(heard), "sockets_untold": n - len(told), "codes": sorted(set(codes)),
            "probe_events": probe_events, "probe_first_audio_s": None if first_audio is None else round(first_audio, 3)}


# Issue 14: one tenant floods admission with more sessions than the engine has room for, each speaking
# utterances back to back. It is refused past its waiting bound (queue_full, the bound named) and waits
# its turn (audio.waiting "queue"); another tenant (the canary's key) is still served in turn. With
# `sentences` > 1 each turn sends that many utterances at once, as a sentence-by-sentence client does:
# each listener then holds two streams (its next starts beside the one heard), never more.
@attack("queue_flood")
async def queue_flood(ctx: Context) -> dict[str, Any]:
    from canary import auth_headers, ws_url

    n, seconds = int(ctx.options.get("sockets", 8)), float(ctx.options.get("seconds", 6.0))
    sentences = int(ctx.options.get("sentences", 1))
    headers = auth_headers(ctx.options.get("flood_key", ctx.key))
    text = "The flood asks for one more reply, and then another one."

    async def flood() -> dict[str, int]:
        seen: dict[str, int] = {}
        ws = await websockets.connect(ws_url(ctx.url), max_size=None, additional_headers=headers, open_timeout=30)
        await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
        await asyncio.wait_for(ws.recv(), 30)
        end = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
            while time.monotonic() < end:
                for _ in range(sentences):
                    await ws.send(json.dumps({"type": "input.text", "text": text}))
                    await ws.send(json.dumps({"type": "input.done"}))
                done = 0
                while done < sentences:
                    msg = await asyncio.wait_for(ws.recv(), 60)
                    if isinstance(msg, bytes):
                        continue
                    ev = json.loads(msg)
                    name = {"error": f"error:{ev.get('code')}:{ev.get('bound')}",
                            "audio.waiting": f"waiting:{ev.get('reason')}"}.get(ev["type"], ev["type"])  # fmt: skip
                    if name == "session.done" or ":" in name:
                        seen[name] = seen.get(name, 0) + 1
                    done += ev["type"] == "session.done"
        await ws.close()
        return seen

    total: dict[str, int] = {}
    for seen in await asyncio.gather(*(flood() for _ in range(n))):
        for name, count in seen.items():
            total[name] = total.get(name, 0) + count
    return dict(sorted(total.items()))


# Issue 14: one tenant posts several full batches at once (POST /v1/audio/speech/batch: up to 32 items,
# 8192 characters, a body near its bound) while the canary (another key) speaks. Every item is a stream
# through admission: past the tenant's bounds they are refused per item (queue_full), parsing, encoding
# and base64 run off the loop, and the canary still gets its turn.
@attack("batch_flood")
async def batch_flood(ctx: Context) -> dict[str, Any]:
    n, items = int(ctx.options.get("batches", 3)), int(ctx.options.get("items", 32))
    chars, fmt = int(ctx.options.get("chars", 250)), str(ctx.options.get("format", "mp3"))
    flood = Context(ctx.url, ctx.options.get("flood_key", ctx.key))
    sentence = "A batch item speaks a plain sentence of the flood. "
    text = (sentence * (chars // len(sentence) + 1))[:chars]
    body = {"voice": "joe", "response_format": fmt, "items": [{"input": text} for _ in range(items)]}
    seen: dict[str, int] = {}
    for status, out in await asyncio.gather(*(asyncio.to_thread(_post_json, flood, "/v1/audio/speech/batch", body)
                                              for _ in range(n))):  # fmt: skip
        seen[f"http:{status}"] = seen.get(f"http:{status}", 0) + 1
        for r in out.get("results", []):
            name = "success" if r["status"] == "success" else f"error:{r.get('code')}:{r.get('bound')}"
            seen[name] = seen.get(name, 0) + 1
    return dict(sorted(seen.items()))


# Issue 16: an admin loads and unloads a model again and again (POST /v1/admin/models/{name}/load, then
# /unload with a short grace) while the canary speaks on another model: each load runs off the loop, each
# unload drains, and nothing of a model unloaded stays behind (the server's memory stays flat).
@attack("model_churn")
async def model_churn(ctx: Context) -> dict[str, Any]:
    import urllib.request

    from canary import auth_headers, http_url

    name, seconds = str(ctx.options.get("model", "spare")), float(ctx.options.get("seconds", 3.0))
    admin = Context(ctx.url, ctx.admin_key or ctx.options.get("admin_key"))

    def state() -> str:
        req = urllib.request.Request(f"{http_url(ctx.url)}/v1/admin/models/{name}", headers=auth_headers(admin.key))
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(json.load(r)["state"])

    seen: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for action, wanted in (("load", "ready"), ("unload", "unloaded")):
            status, _ = await asyncio.to_thread(_post_json, admin, f"/v1/admin/models/{name}/{action}", {"grace_s": 0.2}
                                                if action == "unload" else {})  # fmt: skip
            seen[f"{action}:{status}"] = seen.get(f"{action}:{status}", 0) + 1
            deadline = time.monotonic() + 30
            while (now := await asyncio.to_thread(state)) != wanted and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            seen[f"{action}:{now}"] = seen.get(f"{action}:{now}", 0) + 1
    return dict(sorted(seen.items()))


# Issue 18: several contexts on one socket. A client opens context after context, each with a sentence
# and never an input.done, as fast as the socket takes them: past `max_contexts` each is refused
# (too_many_contexts, naming it), the open ones stay bounded, and the canary beside it keeps speaking.
@attack("context_flood")
async def context_flood(ctx: Context) -> dict[str, Any]:
    sockets, contexts = int(ctx.options.get("sockets", 4)), int(ctx.options.get("contexts", 200))
    wss = [await _config_session(ctx) for _ in range(sockets)]
    readers = [asyncio.create_task(_codes(ws, float(ctx.options.get("seconds", 3.0)))) for ws in wss]
    for i in range(contexts):
        for n, ws in enumerate(wss):
            text = f"Context {i} of socket {n} says a sentence that is never finished. "
            await ws.send(json.dumps({"type": "input.text", "text": text, "context_id": f"c{i}"}))
        await asyncio.sleep(0)
    codes = [c for r in readers for c in await r]
    for ws in wss:
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(json.dumps({"type": "input.cancel"}))
        await ws.close()
    refused = codes.count("too_many_contexts")
    return {"sent": sockets * contexts, "codes": sorted(set(codes)), "too_many_contexts": refused}


# Hardening round two, finding 4: a reconnect storm (a deploy, a balancer's failover). `sessions` sockets
# send session.config at the same instant; each must get session.ready, or past the gateway's capacity a
# capacity refusal (queue_full, close 1013), never state_unavailable: a local pool running out is not an
# outage (before: 128 at once exhausted the store's pool, the breaker opened, all 128 were refused).
async def _burst_session(ctx: Context, i: int, start: asyncio.Event, answered: set[int], hold: asyncio.Event,
                         ) -> tuple[str, int | None]:  # fmt: skip
    """('ready' or the refusal's code or how it failed, the close code of a refused socket)."""
    from canary import auth_headers, ws_url

    await start.wait()
    try:
        async with websockets.connect(ws_url(ctx.url), additional_headers=auth_headers(ctx.key),
                                      open_timeout=60) as ws:  # fmt: skip
            try:
                await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
                ev = json.loads(await asyncio.wait_for(ws.recv(), 60))
            finally:
                answered.add(i)
            if ev["type"] != "session.ready":
                with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)  # the server closes a refused first message
                return str(ev.get("code", ev["type"])), ws.close_code
            await hold.wait()  # every session of the storm is open at once
            return "ready", None
    except websockets.ConnectionClosed as e:
        return "closed", e.rcvd.code if e.rcvd else None
    except (OSError, TimeoutError, websockets.InvalidHandshake) as e:
        return f"connect_failed:{type(e).__name__}", None
    finally:
        answered.add(i)


@attack("connect_burst")
async def connect_burst(ctx: Context) -> dict[str, Any]:
    n = int(ctx.options.get("sessions", 160))
    start, hold, answered = asyncio.Event(), asyncio.Event(), set[int]()
    tasks = [asyncio.create_task(_burst_session(ctx, i, start, answered, hold)) for i in range(n)]
    await asyncio.sleep(0.1)  # every socket waits on the start line
    t0 = time.monotonic()
    start.set()
    while len(answered) < n and time.monotonic() - t0 < 90:
        await asyncio.sleep(0.05)
    hold.set()
    results = [await t for t in tasks]
    codes: dict[str, int] = {}
    for code, _ in results:
        codes[code] = codes.get(code, 0) + 1
    close_codes = sorted({c for code, c in results if code != "ready" and c is not None})
    return {"sessions": n, "ready": codes.pop("ready", 0), "refused": codes, "close_codes": close_codes,
            "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip


# Review 2026-12 findings 2, 7 and 15: the admin plane and /metrics. A proxy on the same host makes every
# caller loopback; a web page makes its visitor's browser a loopback caller (a text/plain POST needs no
# preflight; DNS rebinding lets the page read the answers); a page's WebSocket carries its Origin. Each
# request is sent `rounds` times; `seen` maps each case to the statuses (or close codes) it got.
def _http(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, str]:
    """(status, error code or "") of one request; `headers` may set Host (a rebound name)."""
    import urllib.error
    import urllib.request

    from canary import http_url

    req = urllib.request.Request(http_url(url) + path, body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        try:
            return e.code, str(json.load(e)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            return e.code, ""


async def _tally(cases: dict[str, Callable[[], tuple[int, str]]], rounds: int) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = {name: set() for name in cases}
    for _ in range(rounds):
        for name, send in cases.items():
            status, code = await asyncio.to_thread(send)
            seen[name].add(f"{status} {code}".strip())
    return {name: sorted(v) for name, v in seen.items()}


@attack("admin_via_proxies")
async def admin_via_proxies(ctx: Context) -> dict[str, Any]:
    """The admin plane and /metrics through the shipped balancers (`proxies`: "name=url,…"), no key."""
    model, rounds = str(ctx.options.get("model", "piper")), int(ctx.options.get("rounds", 10))
    proxies = dict(p.split("=", 1) for p in str(ctx.options["proxies"]).split(","))
    json_post = {"Content-Type": "application/json"}
    cases = {f"{name} {what}": send for name, url in proxies.items() for what, send in {
        "GET /v1/admin/models": lambda u=url: _http(u, "GET", "/v1/admin/models", {}),
        "POST load": lambda u=url: _http(u, "POST", f"/v1/admin/models/{model}/load", json_post, b"{}"),
        "GET /metrics": lambda u=url: _http(u, "GET", "/metrics", {}),
    }.items()}  # fmt: skip
    return await _tally(cases, rounds)


@attack("cross_site_requests")
async def cross_site_requests(ctx: Context) -> dict[str, Any]:
    """What a page can make its visitor's browser send to the gateway, straight to the server."""
    from urllib.parse import urlsplit

    model, rounds = str(ctx.options.get("model", "piper")), int(ctx.options.get("rounds", 10))
    own = urlsplit(ctx.url if "://" in ctx.url else f"http://{ctx.url}").netloc
    evil, rebound = {"Origin": "http://evil.example"}, {"Host": f"rebind.evil.example:{own.rsplit(':', 1)[1]}"}
    text = {"Content-Type": "text/plain"}
    load = f"/v1/admin/models/{model}/load"
    own_page = {"Origin": f"http://{own}"}
    cases: dict[str, Callable[[], tuple[int, str]]] = {
        "admin text/plain from a foreign page": lambda: _http(ctx.url, "POST", load, evil | text, b"{}"),
        "admin text/plain": lambda: _http(ctx.url, "POST", load, text, b"{}"),
        "admin cross-site fetch": lambda: _http(ctx.url, "GET", "/v1/admin/models", {"Sec-Fetch-Site": "cross-site"}),
        "admin rebound Host": lambda: _http(ctx.url, "GET", "/v1/admin/models", rebound),
        "metrics rebound Host": lambda: _http(ctx.url, "GET", "/metrics", rebound),
        "api rebound Host": lambda: _http(ctx.url, "GET", "/v1/audio/voices", rebound),
        "speech text/plain from a foreign page": lambda: _http(ctx.url, "POST", "/v1/audio/speech", evil | text, b"{}"),
        "api from the server's own page": lambda: _http(ctx.url, "GET", "/v1/audio/voices", own_page),
    }  # fmt: skip
    return await _tally(cases, rounds)


@attack("foreign_origin_ws")
async def foreign_origin_ws(ctx: Context) -> dict[str, Any]:
    """WebSocket sessions opened by a page of another origin, beside the server's own page and a program."""
    from urllib.parse import urlsplit

    from canary import auth_headers, ws_url
    from websockets.typing import Origin

    own = urlsplit(ctx.url if "://" in ctx.url else f"http://{ctx.url}").netloc
    seen: dict[str, set[str]] = {"foreign": set(), "own page": set(), "no Origin": set()}

    async def open_one(kind: str, origin: str | None) -> None:
        async with websockets.connect(ws_url(ctx.url), origin=None if origin is None else Origin(origin),
                                      additional_headers=auth_headers(ctx.key), open_timeout=30) as ws:  # fmt: skip
            with contextlib.suppress(websockets.ConnectionClosed):  # a refused one may be closed already
                await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if first["type"] == "error":
                with contextlib.suppress(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                seen[kind].add(f"{first['code']} {ws.close_code} {ws.close_reason!r}")
            else:
                seen[kind].add(first["type"])

    for _ in range(int(ctx.options.get("rounds", 10))):
        await open_one("foreign", "http://evil.example")
        await open_one("own page", f"http://{own}")
        await open_one("no Origin", None)
    return {kind: sorted(v) for kind, v in seen.items()}


# Issue 35, finding 1: a tenant lexicon of `entries` words of `word_chars` characters each ("~"… then four
# digits: the costliest an alternation of entries can be) applied to `chars` characters of text as one
# WebSocket segment (`split_granularity: "none"`), then to `http_chars` characters of one POST
# /v1/audio/speech. Application must be linear in the text whatever the entries: no freeze of the
# canary or /health. `text=prose`: ordinary sentences instead of "~" (the entries then never match).
def _lexicon_put(ctx: Context, name: str, entries: dict[str, str]) -> tuple[int, dict[str, Any]]:
    return _post_json(ctx, f"/v1/lexicons/{name}", {"entries": entries}, method="PUT")


def _speech_status(ctx: Context, body: dict[str, Any], timeout: float = 60.0, keep: int = 1 << 20) -> dict[str, Any]:
    """POST /v1/audio/speech: its status, error code, the audio bytes read (at most `keep`: past it the
    connection is closed, which cancels the engine stream) and how long the answer took."""


# Hardening round two, finding 3: `input.done` with nothing open made an utterance past
# `max_open_utterances`. One long utterance keeps the engine busy, then `messages` bare input.done as fast
# as the socket takes them, every event read; then a cancel: how many utterances it found queued.
async def _events(ws: Any, seen: dict[str, int], until: str | None = None, seconds: float = 30.0) -> None:
    """Count a socket's events by type (errors by code) for `seconds`, or until one of type `until`."""
    end = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while (left := end - time.monotonic()) > 0:
            msg = await asyncio.wait_for(ws.recv(), left)
            if isinstance(msg, bytes):
                seen["audio_bytes"] = seen.get("audio_bytes", 0) + len(msg)
                continue
            ev = json.loads(msg)
            kind = f"error:{ev['code']}" if ev["type"] == "error" else ev["type"]
            seen[kind] = seen.get(kind, 0) + 1
            if kind == until:
                return


@attack("bare_done_flood")
async def bare_done_flood(ctx: Context) -> dict[str, Any]:
    messages = int(ctx.options.get("messages", 20000))
    ws = await _config_session(ctx)
    seen: dict[str, int] = {}
    reader = asyncio.create_task(_events(ws, seen, seconds=120))
    await ws.send(json.dumps({"type": "input.text", "text": huge_prose(2000)}))
    await ws.send(json.dumps({"type": "input.done"}))
    bare = json.dumps({"type": "input.done"})
    for i in range(messages):
        await ws.send(bare)
        if i % 500 == 0:
            await asyncio.sleep(0)  # the reader keeps up
    # Wait for the answers, not a fixed time (a loaded box answers 20 000 refusals late): first until the
    # refusals stop coming, then, after the cancel, until every input.done is answered; each wait bounded.
    await _until_quiet(lambda: seen.get("error:too_many_utterances", 0), quiet_s=1.0, within_s=30.0)
    cancelled_before = seen.get("audio.cancelled", 0)
    await ws.send(json.dumps({"type": "input.cancel"}))

    def answered() -> int:
        cancelled = seen.get("audio.cancelled", 0) - cancelled_before
        return seen.get("error:too_many_utterances", 0) + seen.get("session.done", 0) + cancelled

    deadline = time.monotonic() + 30.0
    while answered() < messages and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # what a late answer would add past the count (none is expected)
    reader.cancel()
    await ws.close()
    out = {k: v for k, v in seen.items() if k != "audio_bytes"}
    return out | {"sent": messages, "cancelled": seen.get("audio.cancelled", 0) - cancelled_before}


async def _until_quiet(count: Callable[[], int], quiet_s: float, within_s: float) -> None:
    """Return once `count()` has not changed for `quiet_s`, or after `within_s` at most."""
    deadline, last, since = time.monotonic() + within_s, count(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        await asyncio.sleep(0.05)
        if (now := count()) != last:
            last, since = now, time.monotonic()


def _speech_status(ctx: Context, body: dict[str, Any], timeout: float = 60.0, keep: int = 1 << 20) -> dict[str, Any]:
    """POST /v1/audio/speech: its status, error code, the audio bytes read (at most `keep`: past it the
    connection is closed, which cancels the engine stream) and how long the answer took."""
    import urllib.error
    import urllib.request

    from canary import auth_headers, http_url

    req = urllib.request.Request(http_url(ctx.url) + "/v1/audio/speech", json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"} | auth_headers(ctx.key))  # fmt: skip
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            got = 0
            while got < keep and (chunk := r.read(65536)):
                got += len(chunk)
            return {"status": r.status, "code": None, "bytes": got, "s": round(time.monotonic() - t0, 3)}
    except urllib.error.HTTPError as e:
        try:
            code = json.load(e)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        return {"status": e.code, "code": code, "bytes": 0, "s": round(time.monotonic() - t0, 3)}
    except TimeoutError:
        return {"status": None, "code": "client_timeout", "bytes": 0, "s": round(time.monotonic() - t0, 3)}


async def _utterance_codes(ws: Any, text: str, seconds: float) -> dict[str, Any]:
    """Send `text` as one utterance; the error codes and the audio bytes within `seconds` (then cancel)."""
    t0 = time.monotonic()
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    codes: list[str] = []
    audio, done = 0, False
    end = t0 + seconds
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while (left := end - time.monotonic()) > 0:
            msg = await asyncio.wait_for(ws.recv(), left)
            if isinstance(msg, bytes):
                audio += len(msg)
            elif (ev := json.loads(msg))["type"] == "error":
                codes.append(ev["code"])
            elif ev["type"] == "session.done":
                done = True
                break
    if not done:
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(json.dumps({"type": "input.cancel"}))
    return {"codes": codes, "audio_bytes": audio, "done": done, "s": round(time.monotonic() - t0, 3)}


@attack("lexicon_freeze")
async def lexicon_freeze(ctx: Context) -> dict[str, Any]:
    o = ctx.options
    n, word_chars = int(o.get("entries", 1000)), int(o.get("word_chars", 64))
    chars, http_chars = int(o.get("chars", 65536)), int(o.get("http_chars", 4096))
    entries = {"~" * (word_chars - 4) + f"{i:04d}": "b" for i in range(n)}
    status, out = await asyncio.to_thread(_lexicon_put, ctx, "freeze", entries)
    seen: dict[str, Any] = {"put": status, "put_code": (out.get("error") or {}).get("code")}
    text = ("~" * max(chars, http_chars)) if o.get("text", "tilde") == "tilde" else huge_prose(max(chars, http_chars))
    ws = await _config_session(ctx, split_granularity="none", lexicon="freeze")
    seen["ws"] = await _utterance_codes(ws, text[:chars], float(o.get("ws_s", 60.0)))
    await ws.close()
    body = {"input": text[:http_chars], "voice": "joe", "response_format": "pcm", "lexicon": "freeze"}
    seen["http"] = [await asyncio.to_thread(_speech_status, ctx, body) for _ in range(int(o.get("http_requests", 2)))]
    return seen


# Issue 35, finding 6: a respelling of 128 characters for a one-letter word ("a"), so the text spoken is
# ~50 times the text sent. POST /v1/audio/speech (`http_words` of them: the default is under the 4096
# input bound), a batch of small items and a WebSocket utterance: each must be refused, naming the
# bound (`respelling_too_long`), rather than spoken as hours of audio.
AMPLIFIED = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
             "sixteen seventeen eighteen nineteen twenty")[:128]  # fmt: skip


@attack("lexicon_amplify")
async def lexicon_amplify(ctx: Context) -> dict[str, Any]:
    o = ctx.options
    status, _ = await asyncio.to_thread(_lexicon_put, ctx, "amp", {"a": AMPLIFIED})
    seen: dict[str, Any] = {"put": status}
    words = int(o.get("http_words", 1900))
    body = {"input": "a " * words + ".", "voice": "joe", "response_format": str(o.get("format", "pcm")),
            "lexicon": "amp"}  # fmt: skip
    seen["http"] = await asyncio.to_thread(_speech_status, ctx, body, float(o.get("http_timeout_s", 30.0)))
    batch = {"voice": "joe", "response_format": "pcm", "lexicon": "amp",
             "items": [{"input": "a a a a a."} for _ in range(int(o.get("batch_items", 4)))]}  # fmt: skip
    status, out = await asyncio.to_thread(_post_json, ctx, "/v1/audio/speech/batch", batch,
                                          float(o.get("http_timeout_s", 30.0)))  # fmt: skip
    seen["batch"] = {"status": status, "codes": sorted({r.get("code") or r["status"] for r in out.get("results", [])})}
    ws = await _config_session(ctx, lexicon="amp")
    seen["ws"] = await _utterance_codes(ws, "a " * int(o.get("ws_words", 400)) + ".", float(o.get("ws_s", 10.0)))
    await ws.close()
    return seen


def _post(ctx: Context, path: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
    """A POST's status, headers (lower-cased names) and body, whatever its status (no answer: status 0)."""
    import urllib.error
    import urllib.request

    from canary import auth_headers, http_url

    req = urllib.request.Request(http_url(ctx.url) + path, json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"} | auth_headers(ctx.key))  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    except OSError as e:
        return 0, {}, str(e).encode()


def _code(body: bytes) -> str | None:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(body)["error"]["code"])
    return None


# Hardening round two, finding 14 and "drain keeps busy connections": SIGTERM (option `pid`: the server's
# process) while a socket speaks an utterance, another starts one utterance after another, and a batch runs.
# Then HTTP work must be refused (503 draining, Retry-After), the socket's utterance under way must finish
# while its next one is refused (`draining`), the busy socket must be closed after its utterance (not at
# the grace's end), and the process must exit within the grace even with the batch still running.
async def _speak_through_drain(ws: Any, out: dict[str, Any]) -> None:
    """Read a socket to its close: its events by type, the worst gap between audio frames, how it closed."""
    last: float | None = None
    out.setdefault("events", {})
    try:
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            now = time.monotonic()
            if isinstance(msg, bytes):
                if last is not None:
                    out["worst_gap_s"] = max(out.get("worst_gap_s", 0.0), round(now - last, 3))
                last = now
                continue
            ev = json.loads(msg)
            kind = f"error:{ev['code']}" if ev["type"] == "error" else ev["type"]
            out["events"][kind] = out["events"].get(kind, 0) + 1
            if ev["type"] == "error" and ev["code"] == "draining":
                out["refused"] = {k: ev.get(k) for k in ("rejected_chars", "utterance_index")}
            if ev["type"] in ("session.done", "audio.start"):
                last = None  # a gap between utterances is not a gap in one
    except websockets.ConnectionClosed as e:
        out["close_code"] = e.rcvd.code if e.rcvd is not None else None
    except TimeoutError:
        out["close_code"] = "timeout"
    out["closed_after_s"] = round(time.monotonic() - out["t_term"], 2)


@attack("drain_http")
async def drain_http(ctx: Context) -> dict[str, Any]:
    import os
    import signal

    from canary import http_url

    pid = int(ctx.options["pid"])
    seen: dict[str, Any] = {}
    speaker = await _config_session(ctx)
    busy = await _config_session(ctx)
    await speaker.send(json.dumps({"type": "input.text", "text": huge_prose(300)}))  # open through the SIGTERM
    while not (isinstance(msg := await asyncio.wait_for(speaker.recv(), 30), str) and '"audio.start"' in msg):
        pass
    t_term = time.monotonic() + 1.0
    spoken: dict[str, Any] = {"t_term": t_term}
    kept: dict[str, Any] = {"t_term": t_term}

    async def keep_busy() -> None:  # a new utterance every 0.3 s, as a chatty agent would
        with contextlib.suppress(websockets.ConnectionClosed):
            for i in range(200):
                await busy.send(json.dumps({"type": "input.text", "text": f"Busy turn {i} says a sentence. "}))
                await busy.send(json.dumps({"type": "input.done"}))
                await asyncio.sleep(0.3)

    busy_task = asyncio.create_task(keep_busy())
    readers = [asyncio.create_task(_speak_through_drain(speaker, spoken)),
               asyncio.create_task(_speak_through_drain(busy, kept))]  # fmt: skip
    # A batch long enough to outlast a short grace (two items of ~4 min of audio), started before the SIGTERM.
    batch = {"voice": "joe", "response_format": "pcm", "items": [{"input": huge_prose(4000)}] * 2}
    slow = asyncio.create_task(asyncio.to_thread(_post, ctx, "/v1/audio/speech/batch", batch, 300.0))
    await asyncio.sleep(max(0.0, t_term - time.monotonic()))
    os.kill(pid, signal.SIGTERM)
    await asyncio.sleep(0.3)
    with contextlib.suppress(websockets.ConnectionClosed):  # the utterance under way takes its last text …
        await speaker.send(json.dumps({"type": "input.text", "text": "And its last sentence. "}))
        await speaker.send(json.dumps({"type": "input.done"}))
        # … and the next is refused
        await speaker.send(json.dumps({"type": "input.text", "text": "A new utterance while draining. "}))
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(http_url(ctx.url) + "/health", timeout=5) as r:
            seen["health"] = r.status
    except urllib.error.HTTPError as e:
        seen["health"] = e.code
    for name, path, body in (("speech", "/v1/audio/speech", {"input": "Hello there.", "voice": "joe"}),
                             ("batch", "/v1/audio/speech/batch", {"voice": "joe", "items": [{"input": "Hi."}]}),
                             ("voice", "/v1/audio/voices", {"voice_id": "drained", "base_voice": "joe"})):  # fmt: skip
        status, headers, data = await asyncio.to_thread(_post, ctx, path, body, 30.0)
        seen[name] = {"status": status, "code": _code(data), "retry_after": headers.get("retry-after"),
                      "bytes": len(data)}  # fmt: skip
    await asyncio.gather(*readers)
    busy_task.cancel()
    deadline = time.monotonic() + float(ctx.options.get("exit_within_s", 120))
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if (reap := ctx.options.get("reap")) is not None and reap() is not None:  # the caller's Popen: reaped
            break
        await asyncio.sleep(0.05)
    seen["exited_after_s"] = round(time.monotonic() - t_term, 2)
    status, _, data = await slow
    seen["slow_batch"] = {"status": status, "bytes": len(data)}
    del spoken["t_term"], kept["t_term"]
    return seen | {"speaker": spoken, "busy": kept}


# Hardening round two, finding 8: a tenant with `max_streams` (option `flood_key`: its key) opens HTTP
# streams at once — `requests` speech requests and a batch of `items` — while the canary (another tenant)
# speaks. Only `max_streams` of them may run at a time; the rest are refused (429 stream_limit).
@attack("http_stream_limit")
async def http_stream_limit(ctx: Context) -> dict[str, Any]:
    flood = Context(ctx.url, ctx.options.get("flood_key", ctx.key))
    requests, items = int(ctx.options.get("requests", 3)), int(ctx.options.get("items", 4))
    speech = {"input": huge_prose(int(ctx.options.get("chars", 600))), "voice": "joe", "response_format": "pcm"}
    batch = {"voice": "joe", "response_format": "pcm", "items": [{"input": huge_prose(300)}] * items}
    spans: list[tuple[float, float, int]] = []  # (start, end, streams it ran) of each request that ran any
    seen: dict[str, Any] = {}

    async def one(path: str, body: dict[str, Any]) -> None:
        t0 = time.monotonic()
        status, _, data = await asyncio.to_thread(_post, flood, path, body, 120.0)
        streams = 1 if status == 200 else 0
        key = f"speech:{status}:{_code(data) or ''}"
        if path.endswith("/batch"):
            out = json.loads(data) if status == 200 else {}
            streams = int(out.get("succeeded", 0))
            key = f"batch:{status}:{_code(data) or ''}"
            for r in out.get("results", []):
                name = "item:success" if r["status"] == "success" else f"item:{r.get('code')}"
                seen[name] = seen.get(name, 0) + 1
        seen[key] = seen.get(key, 0) + 1
        if streams:
            spans.append((t0, time.monotonic(), streams))

    await asyncio.gather(*(one("/v1/audio/speech", speech) for _ in range(requests)),
                         one("/v1/audio/speech/batch", batch))  # fmt: skip
    # The most streams granted at once: requests whose spans overlap (a batch counts the items it ran).
    seen["most_at_once"] = max((sum(n for s, e, n in spans if s <= t < e) for t, _, _ in spans), default=0)
    return dict(sorted(seen.items()))


# Hardening round two, finding 10: a tenant (option `flood_key`) opens `uploads` voice registrations that
# announce 100 kB of body and send one byte. Before, four such held every registration place in the process;
# now they hold only their tenant's upload places: another tenant (the attack's key) still registers a
# voice, and the flooding tenant's next upload is refused at once (429 registration_busy).
@attack("slow_voice_uploads")
async def slow_voice_uploads(ctx: Context) -> dict[str, Any]:
    import socket

    from canary import auth_headers, http_url

    host, _, port = http_url(ctx.url).removeprefix("http://").partition(":")
    flood_key = ctx.options.get("flood_key", ctx.key)
    n, hold_s = int(ctx.options.get("uploads", 4)), float(ctx.options.get("hold_s", 2.0))
    headers = {"Content-Type": "application/json", "Content-Length": "100000"} | auth_headers(flood_key)
    head = "POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    slow = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall((head + "\r\n{").encode())
        slow.append(sock)
    await asyncio.sleep(hold_s)  # the handlers have their upload places
    seen: dict[str, Any] = {}
    try:
        preset = {"voice_id": "beside-the-flood", "base_voice": "joe"}
        status, _, data = await asyncio.to_thread(_post, ctx, "/v1/audio/voices", preset, 30.0)
        seen["other_tenant"] = (status, _code(data))
        flood = Context(ctx.url, flood_key)
        status, answered, data = await asyncio.to_thread(_post, flood, "/v1/audio/voices", preset, 30.0)
        seen["same_tenant"] = (status, _code(data), answered.get("retry-after"))
    finally:
        for sock in slow:
            sock.close()
    if seen["other_tenant"][0] == 201:
        await asyncio.to_thread(_delete, ctx, "/v1/audio/voices/beside-the-flood")
    return seen


# Hardening round two, finding 4: a `stream_audio: false` session (one WAV per utterance, at 48 kHz) sends
# `chars_per_s` of prose every second for `seconds`, never input.done: its utterance's audio is made far
# faster than real time and held for its file. It must be bounded (max_file_audio_s): the file made so far
# is sent and the rest refused, named, instead of the server holding the whole utterance's PCM.
@attack("file_mode_hoard")
async def file_mode_hoard(ctx: Context) -> dict[str, Any]:
    seconds, per_s = float(ctx.options.get("seconds", 25.0)), int(ctx.options.get("chars_per_s", 1000))
    ws = await _config_session(ctx, response_format="wav", stream_audio=False,
                               sample_rate=int(ctx.options.get("sample_rate", 48000)))  # fmt: skip
    # After `seconds`, the hoard goes on sending (at most `bound_wait_s` more) until the bound's refusal: a
    # loaded box makes the audio slower than the text comes, and the bound is what is measured. (It keeps
    # sending, not waiting: a pause past the utterance's idle timeout would end the utterance.)
    bound_wait_s = float(ctx.options.get("bound_wait_s", 30.0))
    seen: dict[str, Any] = {"files": 0, "largest_file": 0, "codes": []}
    bound_reached = asyncio.Event()  # set by the reader: a file_too_long came

    async def read() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for msg in ws:
                if isinstance(msg, bytes):
                    seen["files"] += 1
                    seen["largest_file"] = max(seen["largest_file"], len(msg))
                elif (ev := json.loads(msg))["type"] == "error":
                    seen["codes"].append(ev["code"])
                    if ev["code"] == "file_too_long":
                        bound_reached.set()

    reader = asyncio.create_task(read())
    rss0 = await asyncio.to_thread(server_rss, ctx.url)
    i = 0
    while i < seconds or (not bound_reached.is_set() and i < seconds + bound_wait_s):
        text = huge_prose(per_s + 100)[:per_s].replace("Sentence 0 ", f"Sentence {i} ")
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await asyncio.sleep(1.0)
        i += 1
    # What the hoard holds at its end (the cancel below frees it, before the harness measures again).
    seen["rss_held_mb"] = round((await asyncio.to_thread(server_rss, ctx.url) - rss0) / 2**20, 1)
    await ws.send(json.dumps({"type": "input.cancel"}))
    await asyncio.sleep(2.0)
    reader.cancel()
    await ws.close()
    return seen | {"codes": sorted(set(seen["codes"])), "file_too_long": seen["codes"].count("file_too_long")}


# -- more attacks above this line --------------------------------------------------------------------------


# Issue 39: the providers' protocols (gateway/protocols/). Their sockets run the native Connection, so they
# must hold its bounds: malformed, oversized and binary messages in the provider's shapes get stable errors
# and the socket goes on; a client that sends long replies and never reads is disconnected, not buffered.
def _provider_ws_url(ctx: Context, path: str) -> str:
    return ctx.url.replace("http://", "ws://").replace("https://", "wss://") + path


_GARBAGE = ["{not json", json.dumps({"text": 5}), json.dumps({"text": "x" * 300_000}), json.dumps([1, 2]),
            "[" * 100_000, json.dumps({"context_id": "c" * 10_000, "text": "hi"}),
            json.dumps({"transcript": {"nested": [1] * 1000}, "context_id": "a"})]  # fmt: skip
_PROVIDER_PATHS = {  # the socket's path, and the field of its error messages that holds voxgate's code
    "elevenlabs": ("/v1/text-to-speech/joe/multi-stream-input?output_format=pcm_16000", "error"),
    "elevenlabs_single": ("/v1/text-to-speech/joe/stream-input?output_format=pcm_16000", "error"),
    "cartesia": ("/tts/websocket?cartesia_version=2025-04-16", "code"),
}
OVERSIZED_FRAME = 5 * 1024 * 1024  # past the server's WebSocket frame bound (gateway/server.py WS_MAX_BYTES)


async def _provider_errors(ws: Any, seconds: float, key: str, quiet_s: float = 1.0) -> list[dict[str, Any]]:
    """The socket's error messages (those whose `key` field is a code), until it has said nothing for
    `quiet_s`, `seconds` have passed, or it closes."""
    errors: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while (left := end - time.monotonic()) > 0:
            msg = await asyncio.wait_for(ws.recv(), min(left, quiet_s))
            if isinstance(msg, str) and isinstance((m := json.loads(msg)).get(key), str):
                errors.append(m)
    return errors


async def _garbage(ctx: Context, provider: str) -> dict[str, Any]:
    """Sockets sending malformed, oversized and binary messages in rounds; once they have all been answered,
    one frame past the server's frame bound each. Seen: the codes, the error messages' shapes (their sorted
    field names), how many sockets the garbage left open, and how the big frames closed them (1009; or 1006
    where the server dropped the connection while the client was still writing the frame)."""
    path, key = _PROVIDER_PATHS[provider]
    sockets, seconds = int(ctx.options.get("sockets", 4)), float(ctx.options.get("seconds", 3.0))
    url = _provider_ws_url(ctx, path)
    wss = [await websockets.connect(url, max_size=None, open_timeout=30) for _ in range(sockets)]
    readers = [asyncio.create_task(_provider_errors(ws, seconds + 10.0, key)) for ws in wss]
    for _ in range(int(ctx.options.get("rounds", 5))):
        for ws in wss:
            for raw in _GARBAGE:
                with contextlib.suppress(websockets.ConnectionClosed):
                    await ws.send(raw)
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(b"\x00" * 1024)
        await asyncio.sleep(0)
    errors = [m for r in readers for m in await r]
    seen = {"codes": sorted({m[key] for m in errors}), "errors": len(errors),
            "shapes": sorted({",".join(sorted(m)) for m in errors}),
            "open_after_garbage": sum(ws.close_code is None for ws in wss)}  # fmt: skip
    if ctx.options.get("oversized", True):
        for ws in wss:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send("x" * OVERSIZED_FRAME)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.wait_closed(), 10)
        seen["closes"] = sorted({int(ws.close_code or 0) for ws in wss})
    for ws in wss:
        await ws.close()
    return seen


async def _unread(ctx: Context, provider: str) -> dict[str, Any]:
    """Sockets asking for long replies (and, for ElevenLabs, at 44.1 kHz) that never read a byte."""
    path, _ = _PROVIDER_PATHS[provider]
    sockets, seconds = int(ctx.options.get("sockets", 4)), float(ctx.options.get("seconds", 3.0))
    text = huge_prose(4000)
    wss = []
    for n in range(sockets):
        ws = await websockets.connect(_provider_ws_url(ctx, path), max_size=None, open_timeout=30, max_queue=1)
        if provider.startswith("elevenlabs"):
            await ws.send(json.dumps({"text": text, "context_id": f"u{n}", "flush": True}))
        else:
            await ws.send(json.dumps({"context_id": f"u{n}", "transcript": text, "continue": False,
                                      "voice": {"mode": "id", "id": "joe"}, "add_timestamps": True,
                                      "output_format": {"container": "raw", "encoding": "pcm_f32le",
                                                        "sample_rate": 44100}}))  # fmt: skip
        wss.append(ws)
    await asyncio.sleep(seconds)
    for ws in wss:
        ws.transport.abort()  # never read: the server must not wait on them
    return {"codes": ["unread"], "sockets": sockets}


for _provider in _PROVIDER_PATHS:  # elevenlabs_garbage, elevenlabs_unread, …, cartesia_unread
    attack(f"{_provider}_garbage")(functools.partial(_garbage, provider=_provider))
    attack(f"{_provider}_unread")(functools.partial(_unread, provider=_provider))


# Follow-up to issue 39: ElevenLabs' multi-stream-input interleaves its contexts, as ElevenLabs does. A socket
# opens `contexts` contexts at once, each a reply of `chars` characters sent as LiveKit sends it (the text with
# flush, an empty flush, close_context), then one more past the socket's bound, and reads everything. Seen: the
# error codes (too_many_contexts for the last, naming it), the contexts that ended (isFinal) and those whose
# aligned text is all of their text (nothing lost), and how many began their audio before the context opened
# before them had ended (interleaved: the first waits behind none).
@attack("elevenlabs_contexts")
async def elevenlabs_contexts(ctx: Context) -> dict[str, Any]:
    path, _ = _PROVIDER_PATHS["elevenlabs"]
    contexts, chars = int(ctx.options.get("contexts", 5)), int(ctx.options.get("chars", 400))
    texts = {f"c{i}": f"Context {i} speaks. " + huge_prose(chars) for i in range(contexts)}
    got: list[dict[str, Any]] = []
    async with websockets.connect(_provider_ws_url(ctx, path), max_size=None, open_timeout=30) as ws:
        for cid, text in [*texts.items(), ("extra", "One context too many. ")]:
            await ws.send(json.dumps({"text": text, "context_id": cid, "flush": True}))
            await ws.send(json.dumps({"text": "", "context_id": cid, "flush": True}))
            await ws.send(json.dumps({"context_id": cid, "close_context": True}))
        async with asyncio.timeout(float(ctx.options.get("seconds", 120.0))):
            while {m.get("contextId") for m in got if m.get("isFinal")} < set(texts):
                got.append(json.loads(await ws.recv()))
    first = {cid: next((i for i, m in enumerate(got) if m.get("audio") and m.get("contextId") == cid), None)
             for cid in texts}  # fmt: skip
    ended = {m.get("contextId"): i for i, m in enumerate(got) if m.get("isFinal")}
    order = list(texts)
    aligned = {cid: "".join(c for m in got if m.get("contextId") == cid and m.get("normalizedAlignment")
                            for c in m["normalizedAlignment"]["chars"]) for cid in texts}  # fmt: skip
    return {"codes": sorted({m["error"] for m in got if m.get("error")}),
            "refused": sorted({m.get("contextId") for m in got if m.get("error") == "too_many_contexts"}),
            "ended": sorted(cid for cid in ended if cid in texts),
            "whole": sum(aligned[cid].split() == text.split() for cid, text in texts.items()),
            "overlapped": sum(first[b] is not None and first[b] < ended.get(a, len(got))
                              for a, b in itertools.pairwise(order))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--key", default=None, help="an API key, when the gateway has keys")
    p.add_argument("--admin-key", default=None, help="the admin key, when the gateway has one (/metrics: its RSS)")
    p.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    p.add_argument("--json", default="bench/results/attack.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an attack option (e.g. chars=1000000, sockets=8); repeatable")  # fmt: skip
    args = p.parse_args(argv)
    options = dict(kv.split("=", 1) for kv in args.set)
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        p.error(f"unknown attacks {unknown}; known: {list(ATTACKS)}")
    results = [asyncio.run(run(args.url, n, key=args.key, admin_key=args.admin_key, **options)) for n in names]
    print(f"{'attack':<28} {'canary worst wait':>17} {'worst gap':>9} {'underrun':>9} {'utts':>5} {'health worst':>12} "
          f"{'loop lag ≤':>10} {'RSS +MB':>8} {'canary errors / failure'}")  # fmt: skip
    for r in results:
        c = r.canary
        problems = c.failure or ", ".join(e.get("code", "?") for e in c.errors) or "-"
        print(f"{r.name:<28} {c.worst_wait_s:>16.2f}s {c.worst_gap_s:>8.2f}s {c.underrun_s:>8.2f}s {c.utterances:>5} "
              f"{r.health_worst_s:>11.3f}s {r.loop_lag_s!s:>10} {r.rss_growth_mb:>8.1f} {problems}")  # fmt: skip
    with open(args.json, "w") as f:
        json.dump([asdict(r) for r in results], f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
