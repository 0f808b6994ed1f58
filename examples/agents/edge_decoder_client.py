"""An edge client: receive codec frames (about 400 bytes of payload per second) instead of PCM, and
decode them here with voxgate's streaming codec decoder, loaded from the checkpoint's
`speech_tokenizer/` folder, on this client's own chunk schedule with exact carried state.

    .venv/bin/pip install -e '.[qwen3]'          # the Qwen3 engine and this decoder need torch
    .venv/bin/voxgate serve --model tiny &        # or a Qwen3-TTS checkpoint directory
    .venv/bin/python examples/agents/edge_decoder_client.py --checkpoint ~/.cache/voxgate/qwen3-tts-tiny-… \\
        --text "Hello from the edge." --out edge.wav

Reports time to first frame, when playback could start (first decoded chunk), the real-time factor
of local decoding, and bytes on the wire per second of audio. With `--voice` naming a cloned voice
(ICL, on a Base checkpoint), the first message carries the reference frames (PRIME): they are decoded
into the decoder's state and not played, as the server's decoder does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
import wave
from pathlib import Path

import numpy as np
import websockets

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.qwen3.edge import decoder_id, load_stream_decoder  # noqa: E402

HEADER = struct.Struct("<IHB")
EOS, SEGMENT_END, RESET, PRIME = 1, 2, 4, 8


async def run(url: str, checkpoint: Path, text: str, out: Path, chunk: int, seed: int | None,
              voice: str | None = None) -> dict[str, float]:
    decoder = load_stream_decoder(checkpoint)
    local_id = decoder_id(checkpoint)
    pcm: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    decode_s = 0.0
    wire = 0
    async with websockets.connect(url, max_size=None) as ws:
        config = {"type": "session.config", "output_mode": "codec_tokens", "language": "auto", "seed": seed,
                  "voice": voice}
        await ws.send(json.dumps(config))
        ready = json.loads(await ws.recv())
        if ready["type"] != "session.ready":
            raise SystemExit(f"refused: {ready}")
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        first_frame = playback = None
        expected_seq = 0
        while True:
            m = await ws.recv()
            if isinstance(m, str):
                ev = json.loads(m)
                if ev["type"] == "codec.start" and ev["decoder_id"] != local_id:
                    raise SystemExit(f"the server's decoder {ev['decoder_id']} is not ours ({local_id})")
                if ev["type"] == "error":
                    raise SystemExit(f"error {ev['code']}: {ev['message']}")
                if ev["type"] == "session.done":
                    break
                continue
            wire += len(m)
            seq, n, flags = HEADER.unpack_from(m)
            assert seq == expected_seq, f"gap in the frame sequence: {seq} after {expected_seq - 1}"
            expected_seq += 1
            if flags & RESET and decoder.frames:  # a new stream: the decoder starts from a clean state
                decoder = load_stream_decoder(checkpoint)
            codes = np.frombuffer(m, "<i2", offset=HEADER.size).reshape(n, 16)
            if flags & PRIME:  # a cloned voice's reference: where the decoder's state starts, not audio
                decoder.step(codes)
                continue
            if n:
                first_frame = first_frame or time.perf_counter() - t0
                pending.append(codes)
            frames = sum(len(p) for p in pending)
            if frames >= chunk or (flags & EOS and frames):  # this client's own schedule
                t = time.perf_counter()
                pcm.append(decoder.step(np.concatenate(pending)))
                decode_s += time.perf_counter() - t
                pending.clear()
                playback = playback or time.perf_counter() - t0
    audio = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    seconds = audio.size / 24000
    return {
        "time_to_first_frame_s": first_frame or float("nan"),
        "playback_start_s": playback or float("nan"),
        "audio_s": seconds,
        "decode_rtf": decode_s / seconds if seconds else float("nan"),
        "wire_bytes_per_audio_s": wire / seconds if seconds else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="ws://127.0.0.1:8000/v1/audio/speech/stream")
    ap.add_argument("--checkpoint", type=Path, required=True, help="checkpoint dir (or its speech_tokenizer/)")
    ap.add_argument("--text", default="Hello from the edge. The decoder runs here, not on the server.")
    ap.add_argument("--out", type=Path, default=Path("edge.wav"))
    ap.add_argument("--chunk", type=int, default=4, help="frames per local decode")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--voice", default=None, help="a voice of the server's, e.g. a registered clone")
    args = ap.parse_args()
    report = asyncio.run(run(args.url, args.checkpoint, args.text, args.out, args.chunk, args.seed, args.voice))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
