"""Mandarin first audio from the first LLM token, on two or more servers side by side (issue 14).

    voxgate serve --model kokoro --port 8101 &     # e.g. the code before a change, from a git worktree
    voxgate serve --model kokoro --port 8102 &     # and after it
    python bench/zh_first_audio.py --target before=http://127.0.0.1:8101 --target after=http://127.0.0.1:8102 \
        --rounds 3 --json bench/out/zh_first_audio.json

Each response is one Mandarin reply (bench/data/paragraphs.jsonl and the shared corpus, `lang: zh`)
streamed over a warm WebSocket session as an LLM streams it: one or two Han characters a token
(bench/load.py's `llm_pieces`) at `--units-per-s`, paced against absolute deadlines. One response at a
time, so this is the latency a lone listener gets, not a load test (bench/load.py is that). The
targets take turns response by response, their order flipped every round, so a noisy shared box
slows each about as much. Per target and mode: first audio from the first token (the first binary
frame; p50/p95), audible first audio (the first sustained onset above `--onset-dbfs`), the first
commit, the first segment's length, and the gaps a pausing player starting at the onset would
hear. Prints a table; `--json` writes every response and the summary. Loopback targets only; every
wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from audio_metrics import OnsetTracker, frame_of_sample, pausing_player, percentile
from load import WS_PATH, Text, llm_pieces, load_texts
from websockets.asyncio.client import ClientConnection, connect

RESPONSE_TIMEOUT_S = 60.0


@dataclass
class Row:
    target: str
    mode: str
    text_id: str
    round: int
    first_segment: str | None = None
    first_commit_s: float | None = None
    first_audio_s: float | None = None
    audible_s: float | None = None
    audio_s: float = 0.0
    underruns: int | None = None
    stall_s: float | None = None
    error: str | None = None


@dataclass
class Session:
    ws: ClientConnection
    sample_rate: int
    frames: list[tuple[float, int]] = field(default_factory=list)


def ws_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"{url}: loopback targets only")
    return f"ws://{parts.netloc}{WS_PATH}"


async def open_session(url: str, mode: str, voice: str | None) -> Session:
    ws = await connect(ws_url(url), compression=None, max_size=2**24, open_timeout=10)
    config: dict[str, Any] = {"type": "session.config", "language": "zh", "response_format": "pcm",
                              "stream_audio": True, "split_granularity": mode}
    if voice:
        config["voice"] = voice
    await ws.send(json.dumps(config))
    async with asyncio.timeout(10):
        while True:
            msg = await ws.recv()
            if isinstance(msg, str):
                ev = json.loads(msg)
                if ev["type"] == "session.ready":
                    return Session(ws, int(ev.get("sample_rate") or 24000))
                if ev["type"] == "error":
                    await ws.close()
                    raise SystemExit(f"{url}: session.config refused: {ev.get('code')}: {ev.get('message')}")


async def respond(s: Session, text: Text, row: Row, units_per_s: float, onset_dbfs: float) -> Row:
    """Stream `text` and read its events until `session.done`; fills `row`."""
    pieces = llm_pieces(text.text)
    onset = OnsetTracker(s.sample_rate, threshold_dbfs=onset_dbfs)
    frames: list[tuple[float, int]] = []
    t0 = time.perf_counter()  # the first token goes out now

    async def send() -> None:
        for i, piece in enumerate(pieces):
            delay = t0 + i / units_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await s.ws.send(json.dumps({"type": "input.text", "text": piece}))
        await s.ws.send(json.dumps({"type": "input.done"}))

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(RESPONSE_TIMEOUT_S):
            while True:
                msg = await s.ws.recv()
                now = time.perf_counter() - t0
                if isinstance(msg, bytes):
                    frames.append((now, len(msg) // 2))
                    onset.feed(np.frombuffer(msg, dtype="<i2"))
                    continue
                ev = json.loads(msg)
                if ev["type"] == "segment.committed" and row.first_segment is None:
                    row.first_segment, row.first_commit_s = ev["text"], now
                elif ev["type"] == "error":
                    row.error = str(ev.get("code"))
                elif ev["type"] == "session.done":
                    break
        await sender
    except TimeoutError:
        row.error = "timeout"
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
    if frames:
        arrivals, sizes = [t for t, _ in frames], [n for _, n in frames]
        row.first_audio_s = arrivals[0]
        row.audio_s = sum(sizes) / s.sample_rate
        k = frame_of_sample(sizes, onset.onset) if onset.onset is not None else None
        if k is not None and onset.onset is not None:
            row.audible_s = arrivals[k]
            player = pausing_player(arrivals, sizes, s.sample_rate, start_sample=onset.onset)
            row.underruns, row.stall_s = player.underruns, player.stall_s
    return row


def summary(rows: list[Row]) -> dict[str, Any]:
    def col(name: str) -> list[float]:
        return [getattr(r, name) for r in rows if getattr(r, name) is not None]

    firsts = [len(r.first_segment) for r in rows if r.first_segment is not None]
    judged = [r for r in rows if r.underruns is not None]
    return {
        "n": len(rows),
        "errors": sum(1 for r in rows if r.error),
        "first_audio_p50_s": percentile(col("first_audio_s"), 50),
        "first_audio_p95_s": percentile(col("first_audio_s"), 95),
        "audible_p50_s": percentile(col("audible_s"), 50),
        "audible_p95_s": percentile(col("audible_s"), 95),
        "first_commit_p50_s": percentile(col("first_commit_s"), 50),
        "first_segment_chars_median": statistics.median(firsts) if firsts else None,
        "gap_free": sum(1 for r in judged if r.underruns == 0) / len(judged) if judged else None,
        "stall_s_total": sum(col("stall_s")),
    }


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def table(result: dict[str, Any]) -> str:
    head = (f"{'target':10} {'mode':8} {'n':>3} {'err':>3} {'first p50':>9} {'p95':>6} {'audible p50':>11} "
            f"{'p95':>6} {'commit p50':>10} {'1st chars':>9} {'gap-free':>8} {'stall s':>7}")
    lines = [head, "-" * len(head)]
    for key, s in result["summary"].items():
        target, mode = key.split("/")
        gap = "-" if s["gap_free"] is None else f"{s['gap_free']:.0%}"
        lines.append(f"{target:10} {mode:8} {s['n']:>3} {s['errors']:>3} {ms(s['first_audio_p50_s']):>9} "
                     f"{ms(s['first_audio_p95_s']):>6} {ms(s['audible_p50_s']):>11} {ms(s['audible_p95_s']):>6} "
                     f"{ms(s['first_commit_p50_s']):>10} {s['first_segment_chars_median'] or '-':>9} {gap:>8} "
                     f"{s['stall_s_total']:>7.2f}")
    lines.append("times in ms from the first token; first = first audio frame, audible = first sustained onset")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    targets = dict(t.split("=", 1) for t in args.target)
    texts = load_texts(args.texts.split(","), ["zh"])
    if args.max_texts:
        texts = texts[: args.max_texts]
    if not texts:
        raise SystemExit("no Mandarin texts found")
    sessions = {(name, mode): await open_session(url, mode, args.voice)
                for name, url in targets.items() for mode in args.modes}
    try:
        for (name, mode), s in sessions.items():  # warm: the first response of a session pays for imports
            await respond(s, texts[0], Row(name, mode, texts[0].id, -1), args.units_per_s, args.onset_dbfs)
        rows: list[Row] = []
        names = list(targets)
        for rnd in range(args.rounds):
            for i, text in enumerate(texts):
                order = names if (rnd + i) % 2 == 0 else names[::-1]
                for mode in args.modes:
                    for name in order:
                        row = await respond(sessions[name, mode], text, Row(name, mode, text.id, rnd),
                                            args.units_per_s, args.onset_dbfs)
                        rows.append(row)
                        if args.verbose:
                            print(f"{name:8} {mode:7} {text.id:24} first {ms(row.first_audio_s):>5} ms "
                                  f"audible {ms(row.audible_s):>5} ms  {row.first_segment!r}", file=sys.stderr)
    finally:
        for s in sessions.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.ws.close(), 2)
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(f"{r.target}/{r.mode}", []).append(r)
    return {
        "args": {k: v for k, v in vars(args).items() if k != "json_path"},
        "targets": targets,
        "summary": {k: summary(v) for k, v in groups.items()},
        "responses": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", required=True, help="NAME=URL of a running gateway (repeat)")
    p.add_argument("--modes", default="auto", help="split_granularity values, e.g. auto,sentence,clause")
    p.add_argument("--rounds", type=int, default=3, help="passes over the texts")
    p.add_argument("--texts", default="own,corpus", help="own (bench/data) and/or corpus")
    p.add_argument("--max-texts", type=int, default=0, help="at most this many texts (0: all)")
    p.add_argument("--voice", default=None)
    p.add_argument("--units-per-s", type=float, default=20.0, help="LLM tokens per second")
    p.add_argument("--onset-dbfs", type=float, default=-40.0)
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not 1 <= args.rounds <= 100 or args.units_per_s <= 0:
        p.error("rounds must be 1–100 and units-per-s positive")
    result = asyncio.run(main_async(args))
    print(table(result))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=1, ensure_ascii=False))
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
