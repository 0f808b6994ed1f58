"""`x-request-id` on every HTTP response, as the OpenAI API sends it: the client's own when it sent a
usable one (so its logs and ours share the id), else a new one. OpenAI's SDKs read it (LiveKit's plugin
warns on every call when it is missing)."""

from __future__ import annotations

import re
import uuid

from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_USABLE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")  # echoed into a header and logs: a short token only


def request_id(headers: list[tuple[bytes, bytes]]) -> bytes:
    given = next((v for k, v in headers if k.lower() == HEADER), None)
    return given if given is not None and _USABLE.fullmatch(given) else f"req_{uuid.uuid4().hex}".encode()


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        rid = request_id(scope["headers"])

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, rid)]
            await send(message)

        await app(scope, receive, send_with_id)

    return middleware
