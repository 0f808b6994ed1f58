"""A voice-agent turn loop against voxgate: pipe LLM tokens in, play audio out, barge in.

Each turn's reply streams in word by word at `--rate` words/s (standing in for an LLM that is
still writing); the audio comes back while the text is still arriving. `--barge-in S` cancels a
turn S seconds after its first audio, as a user talking over the agent would, and prints what the
listener actually heard. Every turn's audio goes to `OUT/turn-N.wav`. `--clone FILE --clone-text TEXT`
first registers a cloned voice from a reference recording and its transcript (a Qwen3 Base checkpoint;
`--model tiny-base` to try it), then speaks every turn in it.

    voxgate serve &                      # in another terminal
    python examples/agents/streaming_agent.py --turns 3 --barge-in 1.0 --out /tmp/agent
    voxgate serve --model tiny-base &
    python examples/agents/streaming_agent.py --clone me.wav --clone-text "What me.wav says." --turns 1
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import websockets

REPLIES = [
    "Sure, I can help with that. Your order shipped yesterday and should arrive on Friday.",
    "Let me check your balance. You have $1,024.50 available, and your next payment is due on the 5th.",
    "好的，我来帮您查询一下。您的订单已经发货，预计周五送达。",
    "Is there anything else I can do for you today?",
]


async def turn(ws: websockets.ClientConnection, text: str, rate: float, barge_in: float | None) -> dict:
    """One agent reply: stream its tokens, collect its audio; returns the turn's measurements."""
    pieces = re.findall(r"\s*\S+", text) if " " in text else list(text)  # words, or Han characters
    started = time.monotonic()
    sender = asyncio.create_task(_send_tokens(ws, pieces, rate))
    audio, first_audio, result = bytearray(), None, {"text": text}
    cancel_at = None
    while True:
        timeout = None if cancel_at is None else max(0.0, cancel_at - time.monotonic())
        try:
            msg = await asyncio.wait_for(ws.recv(), timeout)
        except TimeoutError:
            sender.cancel()
            await ws.send(json.dumps({"type": "input.cancel"}))
            cancel_at = float("inf")
            continue
        if isinstance(msg, bytes):
            if first_audio is None:
                first_audio = time.monotonic()
                if barge_in is not None:
                    cancel_at = first_audio + barge_in
            audio += msg
            continue
        ev = json.loads(msg)
        if ev["type"] == "error":
            print(f"  error {ev['code']}: {ev['message']}")
        elif ev["type"] == "audio.cancelled":
            result |= {"cancelled": True, "heard": ev["spoken_text"], "played_bytes": ev["played_bytes"]}
            break
        elif ev["type"] == "session.done":
            break
    await asyncio.gather(sender, return_exceptions=True)
    result["ttfa_s"] = None if first_audio is None else first_audio - started
    result["audio"] = bytes(audio)
    return result


async def _send_tokens(ws: websockets.ClientConnection, pieces: list[str], rate: float) -> None:
    for piece in pieces:
        await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await asyncio.sleep(1 / rate)
    await ws.send(json.dumps({"type": "input.done"}))  # a flush: the connection stays open


def register_clone(ws_url: str, audio: Path, transcript: str | None) -> str:
    """POST the reference recording to the gateway's voice registry; the voice id to speak with."""
    http = ws_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1).split("/v1/")[0]
    voice_id = re.sub(r"[^A-Za-z0-9_-]", "-", audio.stem)[:48] or "clone"
    body = {"voice_id": voice_id, "ref_audio": base64.b64encode(audio.read_bytes()).decode(), "ref_text": transcript}
    req = urllib.request.Request(f"{http}/v1/audio/voices", json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60).close()
    except urllib.error.HTTPError as e:
        error = json.load(e).get("error", {})
        if error.get("code") != "voice_exists":  # registered by an earlier run: use it
            raise SystemExit(f"could not register the clone: {error}") from None
    return voice_id


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="ws://127.0.0.1:8000/v1/audio/speech/stream")
    ap.add_argument("--turns", type=int, default=len(REPLIES))
    ap.add_argument("--rate", type=float, default=20.0, help="LLM tokens per second")
    ap.add_argument("--barge-in", type=float, default=None, help="cancel each turn this long after its first audio")
    ap.add_argument("--voice", default=None)
    ap.add_argument("--clone", type=Path, default=None, help="reference recording of a voice to clone (1–30 s)")
    ap.add_argument("--clone-text", default=None,
                    help="what the reference recording says (without it the clone is x-vector only)")
    ap.add_argument("--out", type=Path, default=Path("agent-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.clone is not None:
        args.voice = register_clone(args.url, args.clone, args.clone_text)
        print(f"cloned voice {args.voice!r} registered")
    async with websockets.connect(args.url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": args.voice, "language": "auto"}))
        ready = json.loads(await ws.recv())
        if ready["type"] != "session.ready":
            raise SystemExit(f"session refused: {ready}")
        rate = ready["sample_rate"]
        print(f"session {ready['session_id']} at {rate} Hz")
        for i in range(args.turns):
            r = await turn(ws, REPLIES[i % len(REPLIES)], args.rate, args.barge_in)
            path = args.out / f"turn-{i}.wav"
            with wave.open(str(path), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(rate)
                w.writeframes(r["audio"])
            seconds = len(r["audio"]) / 2 / rate
            ttfa = "-" if r["ttfa_s"] is None else f"{r['ttfa_s'] * 1000:.0f} ms"
            line = f"turn {i}: ttfa {ttfa}, {seconds:.2f} s of audio -> {path}"
            if r.get("cancelled"):
                line += f"; barged in, heard {r['heard']!r}"
            print(line, flush=True)
        await ws.send(json.dumps({"type": "session.close"}))


if __name__ == "__main__":
    asyncio.run(main())
