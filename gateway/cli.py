"""The `voxgate` command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from segmentation import GRANULARITIES, StreamSegmenter, UtteranceLanguage, normalize_for_speech


def _segment(args: argparse.Namespace) -> int:
    """Stream stdin through the segmenter as an LLM would, printing each commit as a JSON line."""
    seg, reading = StreamSegmenter(language=args.language, granularity=args.granularity), UtteranceLanguage()

    def emit(segments: list) -> None:
        for s in segments:
            spoken = normalize_for_speech(s.text, reading.of(s.text, args.language))
            line = {"text": s.text, "start": s.start, "end": s.end, "reason": s.reason, "spoken": spoken}
            print(json.dumps(line, ensure_ascii=False), flush=True)

    while chunk := sys.stdin.read(args.chunk):
        emit(seg.feed(chunk))
    emit(seg.flush())
    return 0


def _key_digest(args: argparse.Namespace) -> int:
    """Each key's digest, a line each: what VOXGATE_API_KEYS and VOXGATE_ADMIN_KEY hold (never the key)."""
    from sessions import hash_api_key

    for key in args.keys:
        print(hash_api_key(key))
    return 0


async def _probe_store(url: str) -> str | None:
    """Fail fast and clearly on an unreachable Redis, before the server starts."""
    from sessions import SessionStore, StateUnavailable

    try:
        store = SessionStore.from_url(url)
    except ValueError as e:  # a URL it cannot use: an unknown scheme, a sentinel URL with no master name
        return f"--redis-url: {e}"
    try:
        await store.start()
    except StateUnavailable as e:
        return str(e)
    finally:
        await store.close()
    return None


def _talker_problems(settings: object) -> list[str]:
    """What stops a model asking for the vLLM talker from ever serving, told before anything loads (vLLM
    missing; on a CPU, a talker head size vLLM's CPU attention has no kernel for): the gateway would
    otherwise start, and the model fail in its engine process."""
    from engine.loader import NO_TALKER

    found = []
    for spec in settings.model_specs():  # type: ignore[attr-defined]
        if str(spec.options.get("talker", "")).strip().lower() == "vllm" and spec.source.lower() not in NO_TALKER:
            from engine.vllm_talker.preflight import problems

            if said := problems(spec.source, spec.options):  # one line a model
                found.append(f"model {spec.name!r}: " + "; ".join(said))
    return found


def _unloadable(settings: object) -> str | None:
    """One line saying why, when no model that loads at start-up can load in this install (a wrong
    `--model`, a missing extra): the gateway would otherwise come up with nothing to serve. A model
    that fails beside one that loads, or later, keeps its "failed" state on /health instead."""
    from engine.loader import unavailable

    specs = [s for s in settings.model_specs() if s.preload]  # type: ignore[attr-defined]
    reasons = [unavailable(spec.source) for spec in specs]
    if not specs or None in reasons:
        return None
    return "; ".join(reasons) if len(reasons) == 1 else "no model can load: " + "; ".join(reasons)  # type: ignore[arg-type]


def _run(app: Any, settings: Any) -> int:
    """Serve until stopped: 0 after a clean stop, 1 when the server could not start or its every model
    failed to load at start-up (told in one line)."""
    from gateway.server import DrainingServer, server_config

    class Gateway(DrainingServer):
        """Stops, saying why, when every model that loads at start-up failed (a config that is not
        valid, a CUDA device that is not there: what `_unloadable` cannot see before loading)."""

        start_failed: str | None = None

        async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
            await super().startup(sockets=sockets)
            if not self.should_exit:
                self._watch = asyncio.create_task(self._watch_start(), name="voxgate-start-watch")

        async def _watch_start(self) -> None:
            if why := await app.state.models.start_failed():
                self.start_failed, self.should_exit = why, True

    # SIGTERM drains first; meanwhile no engine process is restarted
    server = Gateway(server_config(app, settings), app.state.drain, settings.admin_socket,
                     on_drain=app.state.models.retire)  # fmt: skip
    server.run()
    if server.start_failed:
        print(f"voxgate: no model could load: {server.start_failed}", file=sys.stderr)
        return 1
    # A failed start-up (an unreachable Redis, say) leaves the server not started: say so in the exit code.
    return 0 if server.started else 1


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.settings import load_settings
    from sessions import bind_allowed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(
            args.config, host=args.host, port=args.port, model=args.model, redis_url=args.redis_url,
            api_keys=args.api_keys, insecure=args.insecure or None, takeover=args.takeover,
            drain_grace_s=args.drain_grace, first_audio_slo_s=args.first_audio_slo, max_sessions=args.max_sessions,
            engine_processes=False if args.in_process else None,
            admin_socket=args.admin_socket, admin_open_loopback=args.admin_open_loopback or None,
        )  # fmt: skip
        if args.talker:  # the Qwen3 talker backend (engine/qwen3/serving/talker_backend.py TALKERS); tables keep theirs
            settings = dataclasses.replace(settings, engine_options={"talker": args.talker, **settings.engine_options})
        keys = settings.keys()
    except (OSError, ValueError) as e:
        print(f"voxgate: {e}", file=sys.stderr)
        return 2
    if problem := _unloadable(settings):
        print(f"voxgate: {problem}", file=sys.stderr)
        return 2
    if problems := _talker_problems(settings):
        print("\n".join(f"voxgate: {problem}" for problem in problems), file=sys.stderr)
        return 2
    if not bind_allowed(settings.host, keys=keys, insecure=settings.insecure):
        print(
            f"voxgate: refusing to serve {settings.host} with no API keys; configure --api-keys, bind a loopback "
            "address, or pass --insecure",
            file=sys.stderr,
        )
        return 2
    if settings.redis_url and (problem := asyncio.run(_probe_store(settings.redis_url))):
        print(f"voxgate: {problem}", file=sys.stderr)
        return 1
    return _run(create_app(settings), settings)


def build_parser() -> argparse.ArgumentParser:
    """The `voxgate` command's parser (its subcommands' defaults name what runs them)."""
    parser = argparse.ArgumentParser(prog="voxgate", description="Streaming TTS gateway for voice agents")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("segment", help="segment text from stdin as it streams in (JSON lines out)")
    p.add_argument("--language", default="auto")
    p.add_argument("--granularity", default="auto", choices=GRANULARITIES)
    p.add_argument("--chunk", type=int, default=4, help="characters per delta read from stdin")
    p.set_defaults(run=_segment, parser=p)
    p = sub.add_parser("key-digest", help="print the digest to configure for each API key given")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.set_defaults(run=_key_digest, parser=p)
    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--host", help="bind address (default 127.0.0.1; env VOXGATE_HOST)")
    p.add_argument("--port", type=int, help="port (default 8000; env VOXGATE_PORT)")
    p.add_argument("--model", help="the models to serve, comma-separated, the first the default: cpu (default), "
                   "piper, kokoro, synthetic (load tests), tiny, tiny-base, a Qwen3-TTS checkpoint directory, "
                   "or a [[models]] name of --config")
    p.add_argument("--in-process", action="store_true",
                   help="run the engines in the gateway's process (default: each in a child process of its own)")
    p.add_argument("--config", help="a TOML settings file (see gateway/settings.py)")
    p.add_argument("--talker", help="the Qwen3 models' talker: native (default) or vllm (needs vLLM; docs/vllm.md)")
    p.add_argument("--redis-url", help="shared session state (env VOXGATE_REDIS_URL); default: embedded, one process")
    p.add_argument("--api-keys", help="tenant=<sha256hex>,… or a JSON file of tenants (env VOXGATE_API_KEYS)")
    p.add_argument("--insecure", action="store_true", help="allow serving a non-loopback address with no API keys")
    p.add_argument("--takeover", choices=("takeover", "refuse"), help="a second connection to a live session")
    p.add_argument("--drain-grace", type=float, metavar="SECONDS",
                   help="on SIGTERM, open utterances get this long to finish (default 30; env VOXGATE_DRAIN_GRACE_S)")
    p.add_argument("--max-sessions", type=int, metavar="N",
                   help="WebSocket sessions open at once on this replica; past it a new one is refused at its "
                   "handshake (503 replica_full), which a balancer retries elsewhere (default 0: no bound; "
                   "env VOXGATE_MAX_SESSIONS; docs/deploy.md)")
    p.add_argument("--first-audio-slo", type=float, metavar="SECONDS",
                   help="refuse at once (429 / queue_full, bound slo) a stream that would be heard later than this "
                   "after it asked (default 1.5; 0: off; env VOXGATE_FIRST_AUDIO_SLO_S)")
    p.add_argument("--admin-socket", metavar="PATH", help="also serve a Unix socket (mode 0600) that answers the "
                   "admin plane and /metrics without a key (env VOXGATE_ADMIN_SOCKET)")
    p.add_argument("--admin-open-loopback", action="store_true", help="a developer's machine: answer the admin "
                   "plane without a key to direct loopback callers (never behind a proxy or a service mesh)")
    p.set_defaults(run=_serve, parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # A wrong flag after a command is told with that command's usage (its flags), not the top level's.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
