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
wait is bounded. `--cancel-after S` barges in after S seconds of audio (first audio does not depend on
the rest, and a loaded box takes long to speak every reply whole). A response that is not cancelled is
played out (its first frame, its length and its stalls) before the next is sent: sent sooner, the
gateway rightly takes it for a continuation of the reply still playing (its audio due after that one's,
its first audio not held), while this harness would judge it from its own first frame (runs before
2026-12-03 did, and counted gaps no player hears).

`--offline` needs no server: in one process, the first commit on a virtual clock plus each stage of the
first model run (phonemes, the ONNX run with its CPU time, the trim, the resampler; the audio decoded
and kept), the least of `--repeat` runs, under the rules before the first-piece word cut (`RULES`,
`first_cut_han` 0) and now, run by turns so a shared box's other load falls on both alike:

    python bench/zh_first_audio.py --offline --modes auto --repeat 2 --json bench/out/zh_first_offline.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from audio_metrics import OnsetTracker, frame_of_sample, pausing_player, percentile
from load import WS_PATH, Text, llm_pieces, load_texts
from websockets.asyncio.client import ClientConnection, connect

from engine.languages import HAN

RESPONSE_TIMEOUT_S = 60.0
UNMARKED_CHARS = 150  # `--texts unmarked`: about 35 s of speech, 3.75 s of text at 20 tokens/s


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
    utterance: int = 0  # the index of the next utterance: events of earlier ones are left out


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
                    return Session(ws, int(ev.get("sample_rate") or 24000), int(ev.get("next_utterance_index") or 0))
                if ev["type"] == "error":
                    await ws.close()
                    raise SystemExit(f"{url}: session.config refused: {ev.get('code')}: {ev.get('message')}")


async def respond(s: Session, text: Text, row: Row, units_per_s: float, onset_dbfs: float,
                  cancel_after_s: float = 0.0) -> Row:
    """Stream `text` and read its events until `session.done`; fills `row`. With `cancel_after_s`,
    the response is cancelled (`input.cancel`, as a barge-in) once that much audio has come: first
    audio does not depend on the rest, and a loaded box takes minutes to speak every reply whole."""
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
    heard, cancelled = 0, False
    index, s.utterance = s.utterance, s.utterance + 1
    try:
        async with asyncio.timeout(RESPONSE_TIMEOUT_S):
            while True:
                msg = await s.ws.recv()
                now = time.perf_counter() - t0
                if isinstance(msg, bytes):
                    if cancelled:
                        continue
                    frames.append((now, len(msg) // 2))
                    onset.feed(np.frombuffer(msg, dtype="<i2"))
                    heard += len(msg) // 2
                    if cancel_after_s and heard >= cancel_after_s * s.sample_rate:
                        cancelled = True
                        sender.cancel()
                        with contextlib.suppress(BaseException):
                            await sender
                        await s.ws.send(json.dumps({"type": "input.cancel"}))
                    continue
                ev = json.loads(msg)
                if ev.get("utterance_index", index) != index:
                    continue  # the tail of an earlier, cancelled response
                if ev["type"] == "segment.committed" and row.first_segment is None:
                    row.first_segment, row.first_commit_s = ev["text"], now
                elif ev["type"] == "error":
                    row.error = str(ev.get("code"))
                elif ev["type"] in ("session.done", "audio.cancelled"):
                    break
        if not cancelled:
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
        if not cancelled:  # the next response comes once this one has played, as an agent's next turn does
            played_at = t0 + arrivals[0] + row.audio_s + (row.stall_s or 0.0)
            await asyncio.sleep(max(0.0, played_at - time.perf_counter()))
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
    sources = args.texts.split(",")
    texts = load_texts([s for s in sources if s != "unmarked"], ["zh"])
    if "unmarked" in sources:
        texts.append(unmarked_reply())
    if args.max_texts:
        texts = texts[: args.max_texts]
    if not texts:
        raise SystemExit("no Mandarin texts found")
    sessions = {(name, mode): await open_session(url, mode, args.voice)
                for name, url in targets.items() for mode in args.modes}
    try:
        for (name, mode), s in sessions.items():  # warm: the first response of a session pays for imports
            await respond(s, texts[0], Row(name, mode, texts[0].id, -1), args.units_per_s, args.onset_dbfs,
                          args.cancel_after)
        rows: list[Row] = []
        names = list(targets)
        for rnd in range(args.rounds):
            for i, text in enumerate(texts):
                order = names if (rnd + i) % 2 == 0 else names[::-1]
                for mode in args.modes:
                    for name in order:
                        row = await respond(sessions[name, mode], text, Row(name, mode, text.id, rnd),
                                            args.units_per_s, args.onset_dbfs, args.cancel_after)
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


def unmarked_reply(length: int = UNMARKED_CHARS) -> Text:
    """One long reply with no mark at all: the own Mandarin texts run together, their punctuation taken
    out (an LLM that writes Mandarin with no commas; the segmenter commits such a run in pieces as it
    streams, docs/cpu_voices.md)."""
    own = load_texts(["own"], ["zh"])
    return Text("unmarked", "zh", re.sub(f"[^{HAN}]", "", "".join(t.text for t in own))[:length])


# The rules before and after a change, as segmenter policy, for `--offline`'s side-by-side runs. Now:
# before = HEAD before the first-piece word cut (issue 14, `first_cut_han` 0: the first clause went
# whole); the engine is the same code on both sides.
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "before": {"auto": {"first_cut_han": 0}, "clause": {}, "sentence": {}},
    "after": {"auto": {}, "clause": {}, "sentence": {}},
}
STAGES = ("commit_s", "segment_s", "phonemize_s", "run_s", "trim_s", "resample_s")


def first_piece(engine: Any, text: str, mode: str, units_per_s: float,
                rule: str) -> tuple[float, float, Any, Any]:
    """(when the first segment is committed on a virtual clock at `units_per_s` tokens a second, the
    segmenter's own CPU time until then, that Segment, the stream's first piece)."""
    from segmentation import StreamSegmenter

    now = [0.0]
    seg = StreamSegmenter("zh", mode, clock=lambda: now[0], **RULES[rule][mode])
    tokens = llm_pieces(text)
    first, at, cpu = None, len(tokens) / units_per_s, 0.0
    for i, token in enumerate(tokens):
        now[0] = i / units_per_s
        t0 = time.perf_counter()
        got = seg.feed(token)
        cpu += time.perf_counter() - t0
        if got:
            first, at = got[0], now[0]
            break
    if first is None:
        first = seg.flush()[0]
    return at, cpu, first, next(iter(engine.cut_pieces(None, "zh", 0, first.text)))


def run_stages(engine: Any, piece: Any, out_rate: int) -> dict[str, float]:
    """The stages of a stream's first model run, each timed: phonemes (misaki/jieba), the ONNX run,
    the silence trim, the resampler to the session's rate; and how much audio was decoded and kept."""
    from engine.cpu.engine import _trimmed
    from engine.resample import Resampler

    model = engine._kokoro if piece.voice.backend == "kokoro" else engine._piper
    t0 = time.perf_counter()
    units = model.timed_units(piece.text, piece.lang) if piece.voice.backend == "kokoro" else model.timed_units(
        piece.text)
    t1, c1 = time.perf_counter(), time.process_time()
    if piece.voice.backend == "kokoro":
        audio, words = model.run_timed(units[0], piece.voice.info.name, 1.0, None)
    else:
        audio, words = model.run_timed(units[0], 1.0, None)
    t2, c2 = time.perf_counter(), time.process_time()
    kept, rate, _ = _trimmed(audio, model.sample_rate, words)
    t3 = time.perf_counter()
    Resampler(rate, out_rate).push(kept)
    t4 = time.perf_counter()
    # run_cpu_s: the CPU time of the run, all its threads: what a shared box's other load inflates least
    # (its wall time on a quiet box lies between run_cpu_s / threads and run_cpu_s).
    return {"phonemize_s": t1 - t0, "run_s": t2 - t1, "run_cpu_s": c2 - c1, "trim_s": t3 - t2, "resample_s": t4 - t3,
            "decoded_audio_s": audio.size / rate, "kept_audio_s": kept.size / rate}


def offline(args: argparse.Namespace) -> dict[str, Any]:
    """No server: per text, when the first segment is committed (the segmenter fed the same tokens on a
    virtual clock at `--units-per-s`) and what each stage of the first model run of the stream's first
    piece costs, under the rules before and after (RULES), in one process, run by turns (the least of
    `--repeat` runs each: the least disturbed by a shared box's other load). Their sum is the first
    audio a server gives, less the gateway's own few milliseconds."""
    from engine import load_engine

    load_at_start = os.getloadavg()
    engine = load_engine(args.model)
    texts = load_texts(args.texts.split(","), ["zh"])[: args.max_texts or None]
    rows = []
    try:
        for mode in args.modes:
            for text in texts:
                sides = {name: first_piece(engine, text.text, mode, args.units_per_s, name) for name in RULES}
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in RULES}
                for k in range(args.repeat):
                    for name in list(RULES) if k % 2 == 0 else list(RULES)[::-1]:
                        runs[name].append(run_stages(engine, sides[name][3], args.rate))
                for name, (at, cpu, first, piece) in sides.items():
                    best = min(runs[name], key=lambda r: r["run_s"])
                    row = {"rule": name, "mode": mode, "text_id": text.id, "first_segment": first.text,
                           "first_reason": first.reason, "first_piece": piece.text, "commit_s": at,
                           "segment_s": cpu, **best}
                    row["first_audio_s"] = sum(row[k] for k in STAGES)
                    row["first_audio_cpu_s"] = row["first_audio_s"] - row["run_s"] + row["run_cpu_s"]
                    rows.append(row)
                    if args.verbose:
                        print(f"{name:6} {mode:8} {text.id:22} commit {ms(at):>4} + run {ms(row['run_s']):>5}"
                              f" ms  {piece.text!r}", file=sys.stderr)
    finally:
        engine.close()
    out: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json_path"},
                           "load_average": (*load_at_start, *os.getloadavg()), "threads": engine.threads,
                           "rows": rows, "summary": {}}
    keys = (*STAGES, "run_cpu_s", "decoded_audio_s", "kept_audio_s", "first_audio_s", "first_audio_cpu_s")
    for mode in args.modes:
        for name in RULES:
            mine = [r for r in rows if r["mode"] == mode and r["rule"] == name]
            out["summary"][f"{name}/{mode}"] = {
                key: {"p50": percentile([r[key] for r in mine], 50), "p95": percentile([r[key] for r in mine], 95)}
                for key in keys
            }
            out["summary"][f"{name}/{mode}"]["word_cuts"] = sum(1 for r in mine if r["first_reason"] == "word")
            out["summary"][f"{name}/{mode}"]["n"] = len(mine)
    return out


def offline_table(result: dict[str, Any]) -> str:
    """Where the time goes, median per rule and mode (ms), then first audio p50/p95 and the ratio."""
    head = (f"{'rule/mode':16} {'commit':>6} {'segment':>7} {'phonemes':>8} {'onnx run':>8} {'trim':>5} "
            f"{'resample':>8} {'decoded s':>9} {'kept s':>6} {'first p50':>9} {'p95':>6} {'run cpu':>7} {'cpu p50':>7}")
    lines = [head, "-" * len(head)]
    summary = result["summary"]
    for key, s in summary.items():
        lines.append(f"{key:16} {ms(s['commit_s']['p50']):>6} {s['segment_s']['p50'] * 1000:>7.2f} "
                     f"{s['phonemize_s']['p50'] * 1000:>8.1f} {ms(s['run_s']['p50']):>8} "
                     f"{s['trim_s']['p50'] * 1000:>5.2f} {s['resample_s']['p50'] * 1000:>8.2f} "
                     f"{s['decoded_audio_s']['p50']:>9.2f} {s['kept_audio_s']['p50']:>6.2f} "
                     f"{ms(s['first_audio_s']['p50']):>9} {ms(s['first_audio_s']['p95']):>6} "
                     f"{ms(s['run_cpu_s']['p50']):>7} {ms(s['first_audio_cpu_s']['p50']):>7}")
    for mode in {k.split("/")[1] for k in summary}:
        b, a = summary.get(f"before/{mode}"), summary.get(f"after/{mode}")
        if b and a and b["first_audio_s"]["p50"]:
            ratio = a["first_audio_s"]["p50"] / b["first_audio_s"]["p50"]
            lines.append(f"{mode}: first audio p50 after/before = {ratio:.2f}; first-piece word cuts "
                         f"{b['word_cuts']} → {a['word_cuts']} of {a['n']}")
    lines.append("ms from the first token (medians; decoded/kept: the first run's audio before and after the trim;"
                 " run cpu: the run's CPU time, all threads; cpu p50: first audio, the run's CPU time as its wall)")
    lines.append("engine threads per run: " + str(result["threads"]) + ";"
                 f" load average {' '.join(f'{x:.1f}' for x in result['load_average'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", default=[], help="NAME=URL of a running gateway (repeat)")
    p.add_argument("--offline", action="store_true",
                   help="no server: first commit + first model run, the rules before issue 14 and now by turns")
    p.add_argument("--model", default="kokoro", help="--offline: the CPU voices to load")
    p.add_argument("--repeat", type=int, default=5, help="--offline: runs of each first piece (the least counts)")
    p.add_argument("--rate", type=int, default=24000, help="--offline: the session's sample rate (the resampler)")
    p.add_argument("--modes", default="auto", help="split_granularity values, e.g. auto,sentence,clause")
    p.add_argument("--rounds", type=int, default=3, help="passes over the texts")
    p.add_argument("--texts", default="own,corpus",
                   help="own (bench/data), corpus, and/or unmarked (one 150-character reply with no mark)")
    p.add_argument("--max-texts", type=int, default=0, help="at most this many texts (0: all)")
    p.add_argument("--voice", default=None)
    p.add_argument("--units-per-s", type=float, default=20.0, help="LLM tokens per second")
    p.add_argument("--onset-dbfs", type=float, default=-40.0)
    p.add_argument("--cancel-after", type=float, default=0.0,
                   help="cancel each response after this many seconds of audio (0: hear it whole)")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not 1 <= args.rounds <= 100 or args.units_per_s <= 0:
        p.error("rounds must be 1–100 and units-per-s positive")
    if args.offline:
        result = offline(args)
        print(offline_table(result))
    elif not args.target:
        p.error("name at least one --target, or --offline")
    else:
        result = asyncio.run(main_async(args))
        print(table(result))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=1, ensure_ascii=False))
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
