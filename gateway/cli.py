"""The `voxgate` command line."""

from __future__ import annotations

import argparse
import json
import logging
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

    from gateway.app import create_app
    from gateway.settings import load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.config, host=args.host, port=args.port, model=args.model)
    except (OSError, ValueError) as e:
        print(f"voxgate: {e}", file=sys.stderr)
        return 2
    app = create_app(settings)
    # websockets-sansio notices a dead client on the next send (research: cpu_backends_infra §6);
    # pings keep proxies from closing a session that is quiet between turns.
    uvicorn.run(app, host=settings.host, port=settings.port, ws="websockets-sansio", ws_ping_interval=20.0)
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
    p.add_argument("--host", help="bind address (default 127.0.0.1; env VOXGATE_HOST)")
    p.add_argument("--port", type=int, help="port (default 8000; env VOXGATE_PORT)")
    p.add_argument("--model", help="cpu (default), piper, kokoro, tiny or a Qwen3-TTS checkpoint directory")
    p.add_argument("--config", help="a TOML settings file (see gateway/settings.py)")
    p.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
