"""A voice-agent turn loop against voxgate: pipe LLM tokens in, play audio out, barge in.

Each turn's reply streams in word by word at `--rate` words/s (standing in for an LLM that is
still writing); the audio comes back while the text is still arriving and plays in real time.
`--barge-in S` interrupts a turn S seconds into its playback, as a user talking over the agent would
(an `input.cancel` while the server still sends, else only the player stops), and prints what the
listener heard. Every turn's audio, as heard, goes to `OUT/turn-N.wav`. `--clone FILE --clone-text TEXT`
first registers a cloned voice from a reference recording and its transcript (a Qwen3 Base checkpoint;
`--model tiny-base` to try it), then speaks every turn in it.

    .venv/bin/voxgate serve &                      # in another terminal
    .venv/bin/python examples/agents/streaming_agent.py --turns 3 --barge-in 1.0 --out /tmp/agent
    .venv/bin/voxgate serve --model tiny-base &    # needs the qwen3 extra: .venv/bin/pip install -e '.[qwen3]'
    .venv/bin/python examples/agents/streaming_agent.py --clone me.wav --clone-text "What me.wav says." --turns 1
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


class Player:
    """The listener's player: audio plays in real time from its first byte, however fast it arrives (a
    short English reply arrives whole within a second). A barge-in is timed on this clock, and what the
    listener heard is what had played by then."""

    def __init__(self, rate: int) -> None:
        self.rate, self.started, self.received = rate, None, bytearray()

    def receive(self, data: bytes) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.received += data

    def ends_at(self) -> float:
        assert self.started is not None
        return self.started + len(self.received) / 2 / self.rate

    def played(self, now: float) -> bytes:
        samples = 0 if self.started is None else int((now - self.started) * self.rate)
        return bytes(self.received[: 2 * samples])


async def turn(ws: websockets.ClientConnection, text: str, rate: float, sample_rate: int,
               barge_in: float | None) -> dict:  # fmt: skip
    """One agent reply: stream its tokens, play its audio; returns the turn's measurements."""
    pieces = re.findall(r"\s*\S+", text) if " " in text else list(text)  # words, or Han characters
    started = time.monotonic()
    sender = asyncio.create_task(_send_tokens(ws, pieces, rate))
    player, result = Player(sample_rate), {"text": text}
    committed: dict[int, str] = {}  # segment_index → text
    marks: list[tuple[int, int]] = []  # (sample_offset, segment_index): where each segment's audio begins
    cancel_at, stopped_at = None, None
    while True:
        timeout = None if cancel_at is None else max(0.0, cancel_at - time.monotonic())
        try:
            msg = await asyncio.wait_for(ws.recv(), timeout)
        except TimeoutError:  # the user talks over the agent while the server still sends audio
            sender.cancel()
            stopped_at = time.monotonic()
            await ws.send(json.dumps({"type": "input.cancel"}))
            cancel_at = None  # now the audio.cancelled that answers it
            continue
        if isinstance(msg, bytes):
            player.receive(msg)
            if barge_in is not None and cancel_at is None and stopped_at is None:
                cancel_at = player.started + barge_in
            continue
        ev = json.loads(msg)
        if ev["type"] == "error":
            print(f"  error {ev['code']}: {ev['message']}")
        elif ev["type"] == "segment.committed":
            committed[ev["segment_index"]] = ev["text"]
        elif ev["type"] == "audio.mark":
            marks.append((ev["sample_offset"], ev["segment_index"]))
        elif ev["type"] == "audio.cancelled":
            break
        elif ev["type"] == "session.done":
            # All of it has arrived, but the player is still playing it: a barge-in due before its end
            # stops the player then (the server has nothing left to cancel).
            if cancel_at is not None and player.started is not None and cancel_at < player.ends_at():
                await asyncio.sleep(max(0.0, cancel_at - time.monotonic()))
                stopped_at = cancel_at
            break
    await asyncio.gather(sender, return_exceptions=True)
    result["ttfa_s"] = None if player.started is None else player.started - started
    result["audio"] = player.played(stopped_at) if stopped_at is not None else bytes(player.received)
    if stopped_at is not None:
        heard = len(result["audio"]) // 2
        result |= {"cancelled": True, "played_bytes": len(result["audio"]),
                   "heard": "".join(committed.get(seg, "") for offset, seg in marks if offset < heard)}  # fmt: skip
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
    ap.add_argument("--barge-in", type=float, default=None, help="interrupt each turn this long into its playback")
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
            r = await turn(ws, REPLIES[i % len(REPLIES)], args.rate, rate, args.barge_in)
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
