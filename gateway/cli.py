"""The `voxgate` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from segmentation import GRANULARITIES, StreamSegmenter, normalize_for_speech


def _segment(args: argparse.Namespace) -> int:
    """Stream stdin through the segmenter as an LLM would, printing each commit as a JSON line."""
    seg = StreamSegmenter(language=args.language, granularity=args.granularity)

    def emit(segments: list) -> None:
        for s in segments:
            spoken = normalize_for_speech(s.text, args.language)
            line = {"text": s.text, "start": s.start, "end": s.end, "reason": s.reason, "spoken": spoken}
            print(json.dumps(line, ensure_ascii=False), flush=True)

    while chunk := sys.stdin.read(args.chunk):
        emit(seg.feed(chunk))
    emit(seg.flush())
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import Settings, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(Settings(model=args.model))
    # websockets-sansio notices a dead client on the next send (see research: cpu_backends_infra §6).
    uvicorn.run(app, host=args.host, port=args.port, ws="websockets-sansio", ws_ping_interval=20.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="voxgate", description="Streaming TTS gateway for voice agents")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("segment", help="segment text from stdin as it streams in (JSON lines out)")
    p.add_argument("--language", default="auto")
    p.add_argument("--granularity", default="auto", choices=GRANULARITIES)
    p.add_argument("--chunk", type=int, default=4, help="characters per delta read from stdin")
    p.set_defaults(run=_segment)
    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--host", default=os.environ.get("VOXGATE_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("VOXGATE_PORT", "8000")))
    p.add_argument(
        "--model", default=os.environ.get("VOXGATE_MODEL", "cpu"),
        help="a CPU voice backend (cpu, piper, kokoro); tiny or a checkpoint path once the Qwen3 engine lands",
    )  # fmt: skip
    p.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
