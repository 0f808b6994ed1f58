"""The browser playground: static files served at `/` and `/static/*` (no build step).

Wire into the app with `Litestar(route_handlers=[..., *playground_routes])`.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Response, get
from litestar.static_files import create_static_files_router

STATIC_DIR = Path(__file__).resolve().parent / "static"


@get("/", sync_to_thread=False, include_in_schema=False)
def playground_index() -> Response[bytes]:
    # Read per request: small, and an edited page shows up on reload.
    return Response(
        (STATIC_DIR / "index.html").read_bytes(),
        media_type="text/html; charset=utf-8",
        headers={"Cache-Control": "no-cache"},
    )


@get("/favicon.ico", sync_to_thread=False, include_in_schema=False)
def favicon() -> Response[bytes]:
    """The page links its SVG icon; this answers browsers and tools that ask for /favicon.ico anyway."""
    return Response((STATIC_DIR / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                    headers={"Cache-Control": "max-age=86400"})  # fmt: skip


playground_routes: list = [
    playground_index,
    favicon,
    create_static_files_router(
        path="/static", directories=[STATIC_DIR], name="playground_static", include_in_schema=False
    ),
]
