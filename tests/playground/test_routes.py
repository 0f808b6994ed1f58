"""The playground's routes serve the page and its assets; its script parses."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from gateway.playground import STATIC_DIR, playground_routes


@pytest.fixture
def client() -> TestClient:
    return TestClient(Litestar(route_handlers=playground_routes))


def test_index_serves_the_page(client: TestClient) -> None:
    with client as c:
        r = c.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    assert '<script src="/static/playground.js">' in html
    assert 'href="/static/playground.css"' in html
    for element in ("speak", "cancel", "ttfa", "ttfa-audible", "underruns", "segments", "view", "rate"):
        assert f'id="{element}"' in html, element


def test_assets_are_served_with_their_types(client: TestClient) -> None:
    with client as c:
        js = c.get("/static/playground.js")
        css = c.get("/static/playground.css")
        missing = c.get("/static/nope.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404
    # The page speaks the wire protocol (docs/protocol.md), not something else.
    for msg in ("session.config", "input.text", "input.done", "input.cancel", "segment.committed",
                "audio.mark", "audio.cancelled", "session.done"):  # fmt: skip
        assert f'"{msg}"' in js.text, msg
    assert "/v1/audio/speech/stream" in js.text


def test_every_element_the_script_uses_exists() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    js = (STATIC_DIR / "playground.js").read_text()
    used = set(re.findall(r'\$\("([\w-]+)"\)', js))
    assert used, "the script looks up no elements?"
    missing = sorted(i for i in used if f'id="{i}"' not in html)
    assert not missing, missing


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_script_parses() -> None:
    subprocess.run(["node", "--check", str(STATIC_DIR / "playground.js")], check=True, timeout=30)


def test_the_page_has_a_favicon(client: TestClient) -> None:
    with client as c:
        page, svg, ico = c.get("/"), c.get("/static/favicon.svg"), c.get("/favicon.ico")
    assert '<link rel="icon" type="image/svg+xml" href="/static/favicon.svg">' in page.text
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert ico.status_code == 200 and ico.content == svg.content


def test_hidden_wins_over_the_controls_display() -> None:
    css = (STATIC_DIR / "playground.css").read_text()
    assert "[hidden] { display: none !important; }" in css
