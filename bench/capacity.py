"""The gateway's own capacity: how many sessions one replica carries before it, not the engine, adds
latency — with the synthetic engine (`voxgate serve --model synthetic`: babble at `speed` × real time
after `first_audio_s`, at almost no cost), a real server process, a real Redis, and clients in several
processes (so the load generator is not what saturates).

Each session is a conversation: `--turns` replies, each streamed as an LLM streams (word pieces at
`--tokens-per-s`), then `input.done`; the client "plays" the reply at real time and waits for it to end
(and a short think gap) before the next. Per session count it reports:

- gateway CPU per audio-second: the server process's CPU (utime + stime from /proc, every thread; the
  engine's child process not included) over the audio seconds delivered, while the conversations ran;
  and the same by thread (`thread_parts`): the event loop's, the engine client's I/O thread's, libzmq's;
- first audio (first text of a reply → its first audio frame), p50/p99, and the overhead over one
  session (the same percentile at N minus at 1): what concurrency adds;
- the worst playback deficit: how late a frame came after a real-time player, started at the reply's
  first frame, needed it;
- refusals by code (at the handshake: the HTTP 503 body's code; later: the `error` event's);
- RSS per idle session (all connected, none speaking) and per playing session (the peak while they
  speak), each over the server's RSS before the level;
- what held the gateway's event loop while the level ran (its /metrics, read by this loopback client):
  the loop lag's p99, wake-ups over 50 ms late, garbage collection's seconds and generation-2 passes —
  whether a first-audio tail is the gateway's loop (and a collection) or the box;

and the first session count where the gateway adds more than 20 ms at p99 (the knee).

Modes besides the levels (default `--sessions 1,16,64,128,256`):
- `--smoke`: 1 and 4 sessions, one short turn (the CI smoke test, tests/bench/test_capacity_smoke.py);
- `--growth N`: N short sessions one after another (`--concurrency` at once): server RSS sampled along
  the way; flat after the first thousands means nothing is kept per session;
- `--burst N`: N sessions connecting at once: each must be ready or refused with a capacity code;
- `--overflow C`: two replicas with `max_sessions = C` behind HAProxy (deploy/haproxy.cfg as shipped),
  1.5 C clients opening conversations of 1-3 turns one after another: served, refused where the client
  sees it, and handshakes a full replica refused that the balancer retried on the other;
- `--baseline-ref REF[,REF2…]`: every level run against a server from each git ref's tree (`git archive`)
  and this tree's, side by side in one run; with `--together`, each level on every tree at the same
  time (on a shared, noisy box a load that drifts then falls on every tree alike: compare the ratios).

    python bench/capacity.py [--sessions 1,16,64,128,256] [--turns 3] [--procs 4] [--speed 4]
        [--first-audio-s 0.1] [--tokens-per-s 40] [--baseline-ref main] [--smoke | --growth N |
        --burst N | --overflow C] [--keep-logs DIR] [--out bench/results/capacity_s22]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RATE = 24000  # the sessions' sample rate, PCM int16
KNEE_MS = 20.0  # the overhead at p99 the gateway may add (issue 37's goal)
CAPACITY_CODES = frozenset({"replica_full", "queue_full", "draining", "engine_not_ready"})
REPLIES = [
    "Sure, I can help with that. Your order shipped yesterday and should arrive on Thursday. "
    "Is there anything else you would like to know about it?",
    "Of course. The store opens at nine in the morning and closes at eight in the evening, "
    "except on Sundays, when it closes at six.",
    "Let me check that for you. Yes, the blue model is in stock in sizes eight to eleven. "
    "Would you like me to reserve a pair?",
    "Thanks for waiting. I have moved your appointment to Friday at half past two. "
    "You will get a confirmation message shortly.",
]
SHORT = "Hello there, this is a short reply."
_PIECE = re.compile(r"[^\s]+\s*|\s+")


def pieces(text: str) -> list[str]:
    """Word pieces, as an LLM streams them (a word with its trailing space)."""
    return _PIECE.findall(text)


def pct(xs: Sequence[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# ---- the server side: Redis, `voxgate serve --model synthetic`, /proc ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server without persistence on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--dir", str(workdir), "--maxclients", "20000"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


class Server:
    """`voxgate serve --model synthetic` from the source tree `src`, on a free port, with real Redis."""

    def __init__(self, src: Path, redis_url: str, workdir: Path, args: argparse.Namespace, max_sessions: int = 0,
                 name: str = "server") -> None:  # fmt: skip
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        config = workdir / f"{name}-{self.port}.toml"
        config.write_text(
            # Admission lets every session's stream in (the engine's capacity is the synthetic engine's):
            # the benchmark measures the serving path, not admission's queue.
            f"max_active_streams = 4096\nmax_waiting_per_tenant = 4096\nmax_waiting_per_model = 4096\n"
            f"max_sessions = {max_sessions}\nmax_connections = 8192\nredis_max_connections = 512\n"
            f"[engine_options]\nspeed = {args.speed}\nfirst_audio_s = {args.first_audio_s}\ncapacity = 4096\n"
            + (f"step_s = {args.step_s}\n" if args.step_s else "")
        )
        settings_py = (src / "gateway" / "settings.py").read_text()
        if src != REPO and "max_sessions" not in settings_py:
            config.write_text(config.read_text().replace(f"max_sessions = {max_sessions}\n", ""))
        if "admin_open_loopback" in settings_py:  # /metrics for this loopback client: the loop's lag, GC pauses
            config.write_text("admin_open_loopback = true\n" + config.read_text())
        self.log = workdir / f"{name}-{self.port}.log"
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", "synthetic", "--port", str(self.port),
               "--redis-url", redis_url, "--config", str(config)]  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=open(self.log, "ab"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT)  # fmt: skip
        self.pid = self.proc.pid

    def wait_healthy(self, timeout: float = 120) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{self.addr}/health", timeout=1) as r:
                if r.status == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy")

    def cpu_s(self) -> float:
        """The server process's CPU seconds so far (every thread; not its children)."""
        return _proc_stat(Path(f"/proc/{self.pid}/stat"))[1]

    def thread_cpu(self) -> dict[int, tuple[str, float]]:
        """Each thread's (name, CPU seconds so far), by thread id: the event loop's thread is the process's own
        id; libzmq names its threads (`ZMQbg/…`); Python 3.11 names none of its own, so the engine client's
        I/O thread is told apart by what it spends (`thread_parts`)."""
        out: dict[int, tuple[str, float]] = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended while being read
                out[int(task.name)] = _proc_stat(task / "stat")
        return out

    def event_loop(self) -> str:
        """The event loop the server runs: "uvloop" where its library is mapped into the process (uvicorn's
        `loop="auto"`, the gateway's default, picks it wherever the `fast` extra installed it), else "asyncio".
        Read, not assumed: every figure here depends on it (capacity_s25.md, capacity_s28.md)."""
        with contextlib.suppress(OSError):
            if "/uvloop/" in Path(f"/proc/{self.pid}/maps").read_text():
                return "uvloop"
        return "asyncio"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def pauses(self) -> dict[str, float]:
        """The gateway's own pause histograms so far (`voxgate_event_loop_lag_seconds`, and
        `voxgate_gc_pause_seconds` by generation), as cumulative counts keyed "name le" and sums keyed
        "name sum"; {} where the tree has no /metrics for a loopback caller."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(f"http://{self.addr}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name not in PAUSES:
                continue
            for s in family.samples:
                gen = s.labels.get("generation", "")
                if s.name.endswith("_bucket"):
                    key = f"{family.name}{gen} {s.labels['le']}"
                elif s.name.endswith("_sum"):
                    key = f"{family.name}{gen} sum"
                else:
                    continue
                out[key] = out.get(key, 0.0) + s.value
        return out

    def refusals(self) -> int:
        """Handshakes it refused (uvicorn logs each)."""
        return self.log.read_text(errors="replace").count("rejected (503")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def source_tree(ref: str, into: Path) -> Path:
    """The tree of git ref `ref`, unpacked (git archive) under `into`."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    dest = into / f"src-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


# ---- the client side: conversations, in worker processes ----


@dataclass
class Turn:
    ttfa_s: float | None = None  # first text sent → first audio frame
    audio_s: float = 0.0
    deficit_s: float = 0.0  # the latest a frame came after a real-time player needed it
    error: str | None = None


@dataclass
class Conversation:
    refused: str | None = None  # the code it was refused with before it began
    turns: list[Turn] = field(default_factory=list)


async def open_session(url: str, timeout: float) -> tuple[Any, str | None]:
    """Connect and configure: (socket, None), or (None, the refusal's code)."""
    import websockets

    try:
        ws = await websockets.connect(url, max_size=None, open_timeout=timeout, ping_interval=None)
    except websockets.InvalidStatus as e:
        try:
            code = json.loads(bytes(e.response.body or b"{}"))["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = f"http_{e.response.status_code}"
        return None, str(code)
    except (OSError, TimeoutError, websockets.InvalidHandshake) as e:
        return None, f"connect_{type(e).__name__}"
    try:
        await ws.send(json.dumps({"type": "session.config", "voice": "synthetic", "language": "en",
                                  "format": "pcm", "sample_rate": RATE}))  # fmt: skip
        first = json.loads(await asyncio.wait_for(ws.recv(), timeout))
    except (OSError, TimeoutError, websockets.ConnectionClosed) as e:
        await ws.close()
        return None, f"config_{type(e).__name__}"
    if first.get("type") != "session.ready":
        await ws.close()
        return None, str(first.get("code", first.get("type")))
    return ws, None


async def reply(ws: Any, text: str, pace_s: float, timeout: float) -> Turn:
    """Stream `text` at `pace_s` per piece, then input.done; read the reply to its session.done."""
    turn = Turn()
    frames: list[tuple[float, int]] = []
    t0 = time.monotonic()

    async def send() -> None:
        for piece in pieces(text):
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
            await asyncio.sleep(pace_s)
        await ws.send(json.dumps({"type": "input.done"}))

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(timeout):
            while True:
                m = await ws.recv()
                if isinstance(m, bytes):
                    frames.append((time.monotonic(), len(m)))
                    continue
                ev = json.loads(m)
                if ev["type"] == "error":
                    turn.error = str(ev.get("code"))
                    break
                if ev["type"] == "session.done":
                    break
    except TimeoutError:
        turn.error = "timeout"
    except Exception as e:  # a broken socket is this turn's outcome, not the bench's end
        turn.error = type(e).__name__
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
    if frames:
        start, played = frames[0][0], 0
        turn.ttfa_s = start - t0
        for at, n in frames:
            turn.deficit_s = max(turn.deficit_s, at - (start + played / 2 / RATE))
            played += n
        turn.audio_s = played / 2 / RATE
    return turn


async def converse(ws: Any, turns: int, rng: random.Random, args: dict[str, Any]) -> list[Turn]:
    out: list[Turn] = []
    for i in range(turns):
        text = SHORT if args["short"] else REPLIES[rng.randrange(len(REPLIES))]
        turn = await reply(ws, text, 1 / args["tokens_per_s"], args["timeout_s"])
        out.append(turn)
        if turn.error:
            break
        if i < turns - 1:  # the listener hears the reply out, thinks, answers
            await asyncio.sleep(max(0.0, turn.audio_s - (turn.deficit_s or 0)) * args["listen"] + args["think_s"])
    return out


async def _level_worker(n: int, seed: int, url: str, args: dict[str, Any], ctrl: Any) -> list[Conversation]:
    rng = random.Random(seed)
    # Connected a few at a time: a level measures sessions that speak, not a connect burst (--burst does),
    # which on a loaded box refuses some `queue_full` and leaves fewer sessions than asked.
    sem = asyncio.Semaphore(args["connect_at_once"])

    async def connect() -> tuple[Any, str | None]:
        async with sem:
            return await open_session(url, args["timeout_s"])

    opened = await asyncio.gather(*(connect() for _ in range(n)))
    ctrl["connected"].put(n)
    while not ctrl["go"].is_set():  # the parent samples the idle RSS meanwhile
        await asyncio.sleep(0.01)
    convs = [Conversation(refused=code) for _, code in opened]

    async def run(ws: Any, conv: Conversation) -> None:
        await asyncio.sleep(rng.uniform(0, args["ramp_s"]))  # arrivals spread as real calls are
        conv.turns = await converse(ws, args["turns"], rng, args)

    await asyncio.gather(*(run(ws, c) for (ws, _), c in zip(opened, convs, strict=True) if ws is not None))
    await asyncio.gather(*(ws.close() for ws, _ in opened if ws is not None), return_exceptions=True)
    return convs


async def _growth_worker(n: int, seed: int, url: str, args: dict[str, Any], ctrl: Any) -> list[Conversation]:
    """n short sessions, `concurrency` at a time; each one utterance, then closed."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(args["concurrency"])
    convs: list[Conversation] = []

    async def one() -> None:
        async with sem:
            ws, code = await open_session(url, args["timeout_s"])
            conv = Conversation(refused=code)
            if ws is not None:
                conv.turns = await converse(ws, 1, rng, args)
                await ws.close()
            convs.append(conv)
            ctrl["connected"].put(1)

    await asyncio.gather(*(one() for _ in range(n)))
    return convs


async def _burst_worker(n: int, seed: int, url: str, args: dict[str, Any], ctrl: Any) -> list[Conversation]:
    """n sessions connect at once when the parent says go; each then speaks one short reply."""
    ctrl["connected"].put(0)
    while not ctrl["go"].is_set():
        await asyncio.sleep(0.005)
    t0 = time.monotonic()
    opened = await asyncio.gather(*(open_session(url, args["timeout_s"]) for _ in range(n)))
    took = time.monotonic() - t0
    convs = [Conversation(refused=code) for _, code in opened]
    rng = random.Random(seed)
    results = await asyncio.gather(*(converse(ws, 1, rng, args) for ws, _ in opened if ws is not None))
    for conv, turns in zip((c for (ws, _), c in zip(opened, convs, strict=True) if ws is not None), results,
                           strict=True):  # fmt: skip
        conv.turns = turns
    await asyncio.gather(*(ws.close() for ws, _ in opened if ws is not None), return_exceptions=True)
    convs.append(Conversation(refused=f"__took_{took:.3f}"))  # the connect time, carried to the parent
    return convs


async def _overflow_worker(n: int, seed: int, url: str, args: dict[str, Any], ctrl: Any) -> list[Conversation]:
    """n clients, each opening conversations of 1-3 turns one after another until `duration_s` is over."""
    rng = random.Random(seed)
    end = time.monotonic() + args["duration_s"]
    convs: list[Conversation] = []

    async def client() -> None:
        while time.monotonic() < end:
            ws, code = await open_session(url, args["timeout_s"])
            conv = Conversation(refused=code)
            convs.append(conv)
            if ws is None:
                await asyncio.sleep(0.1)
                continue
            conv.turns = await converse(ws, rng.randint(1, 3), rng, args)
            await ws.close()

    ctrl["connected"].put(n)
    await asyncio.gather(*(client() for _ in range(n)))
    return convs


WORKERS = {"level": _level_worker, "growth": _growth_worker, "burst": _burst_worker, "overflow": _overflow_worker}


def _worker_main(kind: str, n: int, seed: int, url: str, args: dict[str, Any], ctrl: dict[str, Any]) -> None:
    convs = asyncio.run(WORKERS[kind](n, seed, url, args, ctrl))
    ctrl["results"].put([asdict(c) for c in convs])


def run_clients(kind: str, n: int, url: str, args: argparse.Namespace, server: Server | None,
                on_connected: Any = None) -> tuple[list[Conversation], dict[str, Any]]:  # fmt: skip
    """n sessions of `kind` over `args.procs` client processes. Returns the conversations and what was
    sampled of the server: CPU seconds and wall time while they ran, RSS before, idle and at its peak."""
    ctx = mp.get_context("spawn")
    ctrl = {"connected": ctx.Queue(), "go": ctx.Event(), "results": ctx.Queue()}
    procs = max(1, min(args.procs, n))
    shares = [n // procs + (i < n % procs) for i in range(procs)]
    wargs = {k: getattr(args, k) for k in ("turns", "tokens_per_s", "timeout_s", "ramp_s", "think_s", "listen",
                                           "short", "concurrency", "duration_s", "connect_at_once")}  # fmt: skip
    sample: dict[str, Any] = {"rss_before_mb": server.rss_mb() if server else None}
    workers = [ctx.Process(target=_worker_main, args=(kind, k, i, url, wargs, ctrl), daemon=True)
               for i, k in enumerate(shares)]  # fmt: skip
    for w in workers:
        w.start()
    cpu0, t0 = (server.cpu_s() if server else 0.0), time.monotonic()  # growth: its sessions run from the start
    if kind == "growth":
        done, marks, step = 0, [], max(1, n // 20)
        while done < n:
            done += ctrl["connected"].get(timeout=args.timeout_s * 4)
            if server and (done % step == 0 or done == n):
                marks.append((done, server.rss_mb()))
        sample["rss_marks"] = marks
    else:
        for _ in workers:
            ctrl["connected"].get(timeout=args.timeout_s * 4)
        if server:
            time.sleep(0.5)  # the sessions' start-up work has settled
            sample["rss_idle_mb"] = server.rss_mb()
    if kind != "growth":  # the levels: from when the connected sessions start speaking
        cpu0, t0 = (server.cpu_s() if server else 0.0), time.monotonic()
        threads0 = server.thread_cpu() if server else {}
    pauses0 = server.pauses() if server and kind != "growth" else {}
    ctrl["go"].set()
    results: list[dict[str, Any]] = []
    peak = sample.get("rss_idle_mb") or 0.0
    while len(results) < len(workers):
        try:
            results.append(ctrl["results"].get(timeout=0.25))
        except queue.Empty:  # sample the RSS, wait on
            if server:
                peak = max(peak, server.rss_mb())
            if not any(w.is_alive() for w in workers) and ctrl["results"].empty():
                raise RuntimeError("a client process died") from None
    sample["wall_s"] = time.monotonic() - t0
    sample["cpu_s"] = (server.cpu_s() - cpu0) if server else None
    sample["rss_peak_mb"] = peak
    if kind != "growth" and server:
        sample |= thread_parts(server.pid, threads0, server.thread_cpu())
    if pauses0 and server:
        sample |= pause_summary(pauses0, server.pauses())
    for w in workers:
        w.join(10)
    convs = [Conversation(c["refused"], [Turn(**t) for t in c["turns"]]) for r in results for c in r]
    return convs, sample


# ---- summaries ----

PAUSES = ("voxgate_event_loop_lag_seconds", "voxgate_gc_pause_seconds")


def pause_summary(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What held the gateway's loop while a level ran: the loop lag's p99 (the bound of the histogram
    bucket it falls in, ms), how many wake-ups came over 50 ms late, and the garbage collections'
    total seconds and count of generation-2 passes (the long ones)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    lag_name = "voxgate_event_loop_lag_seconds"
    lag = sorted((float(k.split()[1]), n) for k, n in delta.items() if k.split()[0] == lag_name and "sum" not in k)
    total = lag[-1][1] if lag else 0.0
    p99 = next((le for le, n in lag if total and n >= 0.99 * total), None)
    over_50ms = total - next((n for le, n in lag if le == 0.05), total)
    gc_s = sum(n for k, n in delta.items() if k.startswith("voxgate_gc_pause_seconds") and k.endswith(" sum"))
    gen2 = delta.get("voxgate_gc_pause_seconds2 +Inf", 0.0)
    longest = None  # the longest collection: per generation, the lowest bucket bound holding all of them
    for gen in ("0", "1", "2"):
        buckets = sorted((float(k.split()[1]), n) for k, n in delta.items()
                         if k.split()[0] == f"voxgate_gc_pause_seconds{gen}" and "sum" not in k)  # fmt: skip
        if buckets and buckets[-1][1] > 0:
            bound = next(le for le, n in buckets if n >= buckets[-1][1])
            longest = bound if longest is None else max(longest, bound)
    return {"loop_lag_p99_ms": _bound_ms(p99), "loop_lags_over_50ms": int(over_50ms), "gc_s": round(gc_s, 3),
            "gc2_passes": int(gen2), "gc_longest_ms": _bound_ms(longest)}  # fmt: skip


def _proc_stat(path: Path) -> tuple[str, float]:
    """A /proc `stat` file's (name, utime + stime in seconds). The name sits in parentheses and may hold
    any character, so the fields are read after its last ')'."""
    head, rest = path.read_text().rsplit(")", 1)
    fields = rest.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_parts(pid: int, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, Any]:
    """The level's CPU seconds by thread: `cpu_loop_s` the event loop's (the main thread: uvicorn, the
    gateway's own code, websockets framing, transport writes), `cpu_io_s` the busiest other Python thread's
    (the engine client's I/O thread: zmq receive, decode, hand-off to the streams), `cpu_zmq_s` libzmq's own
    threads', `cpu_rest_s` every other thread's (asyncio.to_thread workers; threads gone before the level's
    end are not counted)."""
    spent = {tid: (name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()}
    loop = spent.pop(pid, ("", 0.0))[1]
    zmq_s = sum(cpu for name, cpu in spent.values() if name.startswith("ZMQbg"))
    others = sorted((cpu for name, cpu in spent.values() if not name.startswith("ZMQbg")), reverse=True)
    io = others[0] if others else 0.0
    return {"cpu_loop_s": round(loop, 3), "cpu_io_s": round(io, 3), "cpu_zmq_s": round(zmq_s, 3),
            "cpu_rest_s": round(sum(others[1:]), 3)}  # fmt: skip


def _bound_ms(seconds: float | None) -> float | None:
    """A histogram bucket's bound in ms (None: none, or past the last bound)."""
    return None if seconds is None or seconds == float("inf") else round(1000 * seconds, 1)


def summarize(n: int, convs: list[Conversation], sample: dict[str, Any]) -> dict[str, Any]:
    took = [float(c.refused[7:]) for c in convs if c.refused and c.refused.startswith("__took_")]
    convs = [c for c in convs if not (c.refused and c.refused.startswith("__took_"))]
    turns = [t for c in convs for t in c.turns]
    ttfa = [t.ttfa_s for t in turns if t.ttfa_s is not None]
    audio_s = sum(t.audio_s for t in turns)
    codes = Counter(c.refused for c in convs if c.refused) + Counter(t.error for t in turns if t.error)
    before, idle, peak = sample.get("rss_before_mb"), sample.get("rss_idle_mb"), sample.get("rss_peak_mb")
    ready = sum(c.refused is None for c in convs)
    out: dict[str, Any] = {
        "sessions": n, "ready": ready, "turns": len(turns), "audio_s": round(audio_s, 2),
        "ttfa_p50_ms": _ms(pct(ttfa, 50)), "ttfa_p99_ms": _ms(pct(ttfa, 99)),
        "deficit_max_ms": _ms(max((t.deficit_s for t in turns), default=None)),
        "deficit_p99_ms": _ms(pct([t.deficit_s for t in turns], 99)),
        "refusals": dict(codes), "wall_s": round(sample["wall_s"], 2),
        "cpu_s": None if sample.get("cpu_s") is None else round(sample["cpu_s"], 3),
        "cpu_ms_per_audio_s": round(1000 * sample["cpu_s"] / audio_s, 3) if audio_s and sample.get("cpu_s") else None,
        "rss_before_mb": before,
        "rss_per_idle_session_kb": round(1024 * (idle - before) / ready, 1) if idle and before and ready else None,
        "rss_per_playing_session_kb": round(1024 * (peak - before) / ready, 1) if peak and before and ready else None,
    }  # fmt: skip
    if audio_s and "cpu_loop_s" in sample:  # the CPU per audio-second, by thread (thread_parts)
        for part in ("loop", "io", "zmq", "rest"):
            out[f"cpu_{part}_ms_per_audio_s"] = round(1000 * sample[f"cpu_{part}_s"] / audio_s, 3)
    out |= {k: sample[k] for k in ("loop_lag_p99_ms", "loop_lags_over_50ms", "gc_s", "gc2_passes", "gc_longest_ms")
            if k in sample}  # fmt: skip
    if took:
        out["connect_all_s"] = round(max(took), 3)
    if "rss_marks" in sample:
        out["rss_marks"] = [(k, round(mb, 1)) for k, mb in sample["rss_marks"]]
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def add_overhead(rows: list[dict[str, Any]]) -> str | None:
    """Each row's first-audio overhead over the one-session row (same percentile), and the knee: the
    first session count whose p99 overhead passes KNEE_MS (None: none did)."""
    base = next((r for r in rows if r["sessions"] == 1), None)
    knee = None
    for r in rows:
        for p in ("p50", "p99"):
            a, b = r[f"ttfa_{p}_ms"], base and base[f"ttfa_{p}_ms"]
            r[f"overhead_{p}_ms"] = None if a is None or b is None else round(a - b, 1)
        if knee is None and (r["overhead_p99_ms"] or 0) > KNEE_MS:
            knee = r["sessions"]
    return knee


COLUMNS = [("sessions", "sessions"), ("ready", "ready"), ("cpu_ms_per_audio_s", "CPU ms/audio-s"),
           ("cpu_loop_ms_per_audio_s", "loop"), ("cpu_io_ms_per_audio_s", "I/O thread"),
           ("cpu_zmq_ms_per_audio_s", "zmq"), ("cpu_rest_ms_per_audio_s", "rest"),
           ("ttfa_p50_ms", "first audio p50 ms"), ("ttfa_p99_ms", "p99 ms"), ("overhead_p50_ms", "overhead p50"),
           ("overhead_p99_ms", "overhead p99"), ("deficit_max_ms", "worst deficit ms"),
           ("rss_per_idle_session_kb", "RSS/idle kB"), ("rss_per_playing_session_kb", "RSS/playing kB"),
           ("loop_lag_p99_ms", "loop lag p99 ≤ ms"), ("loop_lags_over_50ms", "lags > 50 ms"), ("gc_s", "GC s"),
           ("gc2_passes", "GC gen-2"), ("gc_longest_ms", "longest GC ≤ ms"), ("refusals", "refusals")]  # fmt: skip


def table(rows: list[dict[str, Any]], label: str = "") -> str:
    cols = ([("tree", "tree")] if label else []) + COLUMNS
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k)) for k, _ in cols) + " |")
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "none"
    return str(v)


# ---- modes ----


def levels(args: argparse.Namespace, work: Path, redis: Redis) -> dict[str, Any]:
    trees = [("this", REPO)]
    if args.baseline_ref:  # each ref's tree before this one, in the order given
        refs = args.baseline_ref.split(",")
        trees[:0] = [(ref, source_tree(ref, work)) for ref in refs]
    counts = [int(s) for s in args.sessions.split(",")]
    servers = {name: Server(src, redis.url, work, args, name=re.sub(r"\W", "_", name)) for name, src in trees}
    for s in servers.values():
        s.wait_healthy()
    loops = {name: s.event_loop() for name, s in servers.items()}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    try:
        for _ in range(args.warmup):  # each server's first streams are cold (imports, the bank, the pool)
            for s in servers.values():
                run_clients("level", 2, f"ws://{s.addr}/v1/audio/speech/stream", args, s)
        for n in counts:
            if args.together:  # every tree's level at once: a load that drifts falls on all of them alike
                with ThreadPoolExecutor(len(servers)) as pool:
                    runs = {name: pool.submit(run_clients, "level", n, f"ws://{s.addr}/v1/audio/speech/stream",
                                              args, s) for name, s in servers.items()}  # fmt: skip
                    done = {name: run.result() for name, run in runs.items()}
            else:  # side by side: each count on every tree before the next
                done = {name: run_clients("level", n, f"ws://{s.addr}/v1/audio/speech/stream", args, s)
                        for name, s in servers.items()}  # fmt: skip
            for name, (convs, sample) in done.items():
                row = (summarize(n, convs, sample) | ({"tree": name} if args.baseline_ref else {})
                       | {"event_loop": loops[name]})
                rows[name].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    knees = {name: add_overhead(r) for name, r in rows.items()}
    return {"rows": rows, "knee_sessions": knees}


def growth(args: argparse.Namespace, work: Path, redis: Redis) -> dict[str, Any]:
    s = Server(REPO, redis.url, work, args).wait_healthy()
    try:
        convs, sample = run_clients("growth", args.growth, f"ws://{s.addr}/v1/audio/speech/stream", args, s)
    finally:
        s.stop()
    row = summarize(args.growth, convs, sample)
    marks = row["rss_marks"]
    half = [mb for k, mb in marks if k >= args.growth // 2]
    row["rss_second_half_growth_mb"] = round(half[-1] - half[0], 1) if len(half) > 1 else None
    return {"rows": {"this": [row]}}


def burst(args: argparse.Namespace, work: Path, redis: Redis) -> dict[str, Any]:
    s = Server(REPO, redis.url, work, args, max_sessions=args.max_sessions).wait_healthy()
    try:
        convs, sample = run_clients("burst", args.burst, f"ws://{s.addr}/v1/audio/speech/stream", args, s)
    finally:
        s.stop()
    row = summarize(args.burst, convs, sample)
    other = {k: v for k, v in row["refusals"].items() if k not in CAPACITY_CODES}
    row["not_ready_nor_capacity"] = other
    return {"rows": {"this": [row]}}


def overflow(args: argparse.Namespace, work: Path, redis: Redis) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests"))
    from support.replicas import HAProxy

    c = args.overflow
    replicas = [Server(REPO, redis.url, work, args, max_sessions=c, name=f"replica{i}") for i in range(2)]
    for r in replicas:
        r.wait_healthy()
    lb = HAProxy(replicas[0].addr, replicas[1].addr, work)
    try:
        lb.wait_up()
        offered = c * 3 // 2
        convs, sample = run_clients("overflow", offered, f"ws://{lb.addr}/v1/audio/speech/stream", args, None)
        handed = sum(r.refusals() for r in replicas)
    finally:
        lb.stop()
        for r in replicas:
            r.stop()
    row = summarize(offered, convs, sample)
    row |= {"capacity_each": c, "offered_at_once": offered, "sessions_opened": len(convs),
            "served_share": round(row["ready"] / len(convs), 4) if convs else None,
            "client_visible_refusals": sum(c.refused is not None for c in convs),
            "handshakes_retried_elsewhere": handed}  # fmt: skip
    return {"rows": {"this": [row]}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="1,16,64,128,256", help="session counts, comma-separated")
    p.add_argument("--turns", type=int, default=3, help="replies per conversation")
    p.add_argument("--procs", type=int, default=4, help="client processes")
    p.add_argument("--speed", type=float, default=4.0, help="the synthetic engine's pace, × real time")
    p.add_argument("--first-audio-s", type=float, default=0.1, help="the synthetic engine's time to first audio")
    p.add_argument("--step-s", type=float, default=0.0,
                   help="the synthetic engine's decode step (0: each chunk when due; 0.02: a GPU's step at 4x)")
    p.add_argument("--tokens-per-s", type=float, default=40.0, help="the LLM's pace: word pieces a second")
    p.add_argument("--ramp-s", type=float, default=2.0, help="conversations start spread over this long")
    p.add_argument("--think-s", type=float, default=0.3, help="between a reply's end and the next")
    p.add_argument("--listen", type=float, default=1.0, help="share of each reply listened to before the next")
    p.add_argument("--timeout-s", type=float, default=60.0, help="a reply's wait, a connect's wait")
    p.add_argument("--connect-at-once", type=int, default=8,
                   help="levels: sessions each client process connects at a time before they speak")
    p.add_argument("--warmup", type=int, default=1, help="untimed 2-session rounds per server first")
    p.add_argument("--together", action="store_true",
                   help="with --baseline-ref: run each level on every tree at the same time (a noisy box)")
    p.add_argument("--baseline-ref", help="also run every level on these git refs' trees (comma-separated)")
    p.add_argument("--smoke", action="store_true", help="1 and 4 sessions, one short turn")
    p.add_argument("--growth", type=int, help="this many short sessions one after another")
    p.add_argument("--concurrency", type=int, default=16, help="--growth: sessions at once")
    p.add_argument("--burst", type=int, help="this many sessions connecting at once")
    p.add_argument("--max-sessions", type=int, default=0, help="--burst: the server's max_sessions (0: none)")
    p.add_argument("--overflow", type=int, metavar="C", help="two replicas of max_sessions C behind HAProxy")
    p.add_argument("--duration-s", type=float, default=30.0, help="--overflow: how long clients keep coming")
    p.add_argument("--short", action="store_true", help="one short sentence per reply")
    p.add_argument("--keep-logs", metavar="DIR", help="copy the servers' logs here at the end")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "capacity_s22"), help="JSON/MD path prefix")
    args = p.parse_args(argv)
    if args.smoke:
        args.sessions, args.turns, args.short, args.ramp_s, args.procs = "1,4", 1, True, 0.2, min(args.procs, 2)
    if args.growth or args.burst:
        args.short = True
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    mode = ("growth" if args.growth else "burst" if args.burst else "overflow" if args.overflow
            else "smoke" if args.smoke else "levels")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        work = Path(tmp)
        redis = Redis(work)
        try:
            run = {"growth": growth, "burst": burst, "overflow": overflow}.get(mode, levels)
            result = run(args, work, redis)
        finally:
            redis.stop()
            if args.keep_logs:  # the servers' logs, to read why a session was refused
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                for log in work.glob("*.log"):
                    shutil.copy(log, Path(args.keep_logs) / log.name)
    result = {"mode": mode, "command": "python bench/capacity.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "args": {k: v for k, v in vars(args).items() if k != "out"}, "cores": os.cpu_count(),
              "load_avg": os.getloadavg()} | result  # fmt: skip
    where = f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    loops = sorted({r["event_loop"] for rows in result["rows"].values() for r in rows if "event_loop" in r})
    if loops:  # the server's loop (uvloop or asyncio's) moves every figure: each table says which it was
        where += f", the server's event loop: {' and '.join(loops)}"
    text = [f"## capacity: {mode}", "", f"`{result['command']}` ({where})", ""]
    for name, rows in result["rows"].items():
        text += [table(rows, name if len(result["rows"]) > 1 else ""), ""]
    if "knee_sessions" in result:
        for name, knee in result["knee_sessions"].items():
            text.append(f"- {name}: the gateway first adds > {KNEE_MS:.0f} ms at p99 at "
                        f"{knee if knee else 'none of the counts run'} sessions")  # fmt: skip
    for rows in result["rows"].values():
        for r in rows:
            extra = {k: r[k] for k in ("rss_marks", "rss_second_half_growth_mb", "connect_all_s",
                                       "not_ready_nor_capacity", "served_share", "client_visible_refusals",
                                       "handshakes_retried_elsewhere", "sessions_opened") if k in r}  # fmt: skip
            if extra:
                text.append(f"- {json.dumps(extra)}")
    report = "\n".join(text) + "\n"
    print(report)
    out = Path(f"{args.out}_{mode}" if mode != "levels" else args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
