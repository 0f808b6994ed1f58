"""How the gateway is served: uvicorn's settings in one place (the CLI and the tests use the same), with
the edges an exposed server needs: a deadline for a request's headers (slowloris), a keep-alive
timeout, a connection limit, a WebSocket message bound, API keys kept out of the logs, and the admin
socket (a Unix socket beside host:port for the keyless admin plane).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import stat
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.drain import Drain
from gateway.protocol import MAX_CONFIG_BYTES
from gateway.settings import Settings

# The largest WebSocket message the socket layer accepts, after permessage-deflate: the config bound
# plus room for its JSON. The protocol decides per message type below that (gateway/protocol.py).
WS_MAX_BYTES = MAX_CONFIG_BYTES + 64 * 1024
uvicorn_log = logging.getLogger("uvicorn.error")


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers: uvicorn has none, so a
    client that sends a header byte every few seconds (or nothing at all) would hold its connection,
    and one of the `max_connections`, forever."""

    header_timeout = 10.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on a kept-alive connection starts its own clock
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in (or the connection upgraded)
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class ReadAhead(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, reading ahead of the app by a few small messages.

    uvicorn stops reading a socket after every message and starts again once the app has taken it: two
    epoll changes per message, 7.5 of the 14 µs a word piece costs on its way in (`python
    bench/capacity_parts.py --only wsread`, bench/results/capacity_s28.md). Here reading stops only once
    `read_ahead_messages` messages or `read_ahead_bytes` of them wait for the app, so a client streaming
    word pieces that the app keeps up with never pauses. The bound per connection stays one message past
    the limit: below what one message of `WS_MAX_BYTES` already held (a single large message stops
    reading at once, as before)."""

    read_ahead_messages = 16
    read_ahead_bytes = 16 * 1024
    _queued_bytes = 0

    def send_receive_event_to_app(self) -> None:
        paused = self.read_paused
        size = sum(len(f) for f in self.frames)
        queued = self.queue.qsize()
        self.read_paused = True  # uvicorn pauses after every message when it is not paused: not here
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if self.queue.qsize() > queued:  # queued (not dropped after the close): counted until the app takes it
            self._queued_bytes += size
        if not paused and (self.queue.qsize() >= self.read_ahead_messages
                           or self._queued_bytes >= self.read_ahead_bytes):  # fmt: skip
            self.read_paused = True
            self.transport.pause_reading()

    async def receive(self) -> Any:
        message = await super().receive()  # reading resumes once the queue is empty, as uvicorn's does
        if self.queue.empty():
            self._queued_bytes = 0
        else:  # a text message counted in characters here, in bytes when queued: never below its true size
            self._queued_bytes -= len(message.get("text") or message.get("bytes") or b"")
        return message


class RedactKeys(logging.Filter):
    """`?api_key=…` (browsers' WebSockets) never reaches a log line: uvicorn logs request paths."""

    _KEY = re.compile(r"(api[_-]key=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._KEY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = self._KEY.sub(r"\1***", record.msg)
        return True


def redact_key_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(RedactKeys())


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    protocol = type("Http", (HeaderDeadline,), {"header_timeout": settings.header_timeout})
    options: dict[str, Any] = dict(
        host=settings.host, port=settings.port, ws=ReadAhead, http=protocol,
        # websockets-sansio notices a dead client on the next send (research: cpu_backends_infra §6);
        # pings keep proxies from closing a session that is quiet between turns.
        ws_ping_interval=20.0, ws_max_size=WS_MAX_BYTES,
        # No permessage-deflate: compressing PCM gains little and cost the event loop more than anything
        # else under load (profiled), and inflating client messages let a few kilobytes on the wire
        # become megabytes. Negotiation is optional, so every client still connects.
        ws_per_message_deflate=False,
        timeout_keep_alive=settings.keep_alive_timeout, limit_concurrency=settings.max_connections,
        loop=settings.event_loop,  # uvicorn's names: auto (uvloop where installed), asyncio, uvloop
        # Requests still running when the server stops (after the drain) get at most the drain's grace:
        # uvicorn would otherwise wait for them without bound, past any orchestrator's kill.
        timeout_graceful_shutdown=settings.drain_grace_s,
    )  # fmt: skip
    config = uvicorn.Config(app, **(options | overrides))  # configures uvicorn's loggers
    redact_key_logs()
    return config


def bind_admin_socket(path: str) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 before it listens (only its owner can connect). A
    stale socket file left by a dead server is replaced; a live server's, or any other file, is an error."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"admin socket {path}: a file that is not a socket is there")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(path)  # nobody listens: a crashed server's
            else:
                raise OSError(f"admin socket {path}: another server is listening on it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(128)  # connections made before the app has started wait here
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class GatewayServer(uvicorn.Server):
    """uvicorn's server, also answering on the admin socket (settings `admin_socket`) when one is given:
    the same app, which lets that socket's callers reach the admin plane without a key (gateway/admin.py)."""

    def __init__(self, config: uvicorn.Config, admin_socket: str = "") -> None:
        super().__init__(config)
        self.admin_socket = admin_socket
        self._admin_sock: socket.socket | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.admin_socket:
            try:
                self._admin_sock = bind_admin_socket(self.admin_socket)
            except OSError as e:
                uvicorn_log.error("%s", e)
                sys.exit(3)  # uvicorn's start-up failure
        try:
            await super().startup(sockets=sockets)
            if self._admin_sock is not None and not self.should_exit:
                config = self.config
                loop = asyncio.get_running_loop()

                def protocol() -> asyncio.Protocol:
                    return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore[call-arg]
                                                      app_state=self.lifespan.state, _loop=loop)  # fmt: skip

                self.servers.append(await loop.create_server(protocol, sock=self._admin_sock))
                uvicorn_log.info("admin socket on %s (mode 0600)", self.admin_socket)
        except BaseException:
            self._remove_admin_socket()
            raise

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets=sockets)
        finally:
            self._remove_admin_socket()

    def _remove_admin_socket(self) -> None:
        if self._admin_sock is not None:
            self._admin_sock.close()
            self._admin_sock = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.admin_socket)


class DrainingServer(GatewayServer):
    """uvicorn's server, but the first SIGTERM drains before it exits (gateway/drain.py): no new sessions,
    open utterances finish (within the grace period), every socket is told to resume elsewhere. A second
    SIGTERM, or SIGINT, exits at once as uvicorn does (it closes what is still open with 1012).
    `on_drain` is called as the drain begins (the models stop restarting their engine processes)."""

    def __init__(
        self, config: uvicorn.Config, drain: Drain, admin_socket: str = "", on_drain: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config, admin_socket)
        self.drain = drain
        self.on_drain = on_drain
        self.drained_in: float | None = None
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._drain_task is not None or not self.started:
            super().handle_exit(sig, frame)
            return
        # A signal handler: the loop runs in this thread, between two of its callbacks.
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain(), name="voxgate-drain")

    async def _drain(self) -> None:
        try:
            if self.on_drain is not None:
                self.on_drain()
            self.drained_in = await self.drain.run()
            # The HTTP requests still running share what is left of the grace (at least a second).
            self.config.timeout_graceful_shutdown = max(1.0, self.drain.grace_s - self.drained_in)
        finally:
            self.should_exit = True
