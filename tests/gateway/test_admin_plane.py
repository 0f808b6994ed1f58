"""Who reaches the admin plane and /metrics, and what a web page can make a browser do (gateway/admin.py,
gateway/browser.py, deploy/nginx.conf, deploy/haproxy.cfg): against a real server, with the shipped
proxy configs in front of it, and a canary session speaking beside every attack (bench/attack.py).

The server behind the proxies opts in to keyless loopback admin (`admin_open_loopback`, the most open a
server can be configured): the proxies must still never reach the admin plane or /metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import websockets
from attack import Result, run
from support.replicas import REPO, HAProxy, Nginx
from support.servers import free_port, serve
from websockets.typing import Origin

from engine import Engine
from gateway.browser import host_refusal, origin_refusal
from gateway.settings import Settings, load_settings
from sessions import hash_api_key

pytestmark = pytest.mark.slow

WAIT_S, GAP_S, HEALTH_S, RSS_MB = 5.0, 5.0, 1.5, 100.0  # generous: a shared 2-core machine


def assert_undisturbed(r: Result) -> None:
    print(r)  # the numbers, for the record (pytest -s)
    c = r.canary
    assert c.failure is None and not c.errors, c
    assert c.worst_wait_s < WAIT_S and c.worst_gap_s < GAP_S, c
    assert r.health_worst_s < HEALTH_S and set(r.health_statuses) == {"ok"}, r
    assert r.rss_growth_mb < RSS_MB, r


class UnixHTTP(http.client.HTTPConnection):
    """HTTP over a Unix socket (the admin socket)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


def on_socket(path: str, method: str, url: str, headers: dict[str, str] | None = None,
              body: bytes | None = None) -> tuple[int, bytes]:  # fmt: skip
    conn = UnixHTTP(path)
    try:
        conn.request(method, url, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def get(addr: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, error code or "") of a GET."""
    req = urllib.request.Request(f"http://{addr}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return e.code, ""


def post_json(addr: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{addr}{path}", b"{}", method="POST",
                                 headers={"Content-Type": "application/json"} | (headers or {}))  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)["error"]["code"]


# -- without an admin key: the admin socket alone --------------------------------------------------


def test_without_an_admin_key_the_admin_plane_and_metrics_answer_only_the_admin_socket(piper_engine: Engine) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # a Unix socket's path is at most 107 bytes
        path = os.path.join(d, "admin.sock")
        for addr in serve(piper_engine, admin_open_loopback=False, admin_socket=path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # only its owner can connect
            for route in ("/v1/admin/models", "/metrics"):  # loopback is no credential
                assert get(addr, route) == (403, "admin_key_required"), route
            assert post_json(addr, "/v1/admin/models/piper/load") == (403, "admin_key_required")
            status, body = on_socket(path, "GET", "/v1/admin/models")
            assert status == 200 and json.loads(body)["data"][0]["id"] == "piper", body
            status, body = on_socket(path, "GET", "/metrics")
            assert status == 200 and b"process_resident_memory_bytes" in body
            status, body = on_socket(path, "POST", "/v1/admin/models/piper/load", {"Content-Type": "text/plain"}, b"{}")
            assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type", body
            json_type = {"Content-Type": "application/json"}
            assert on_socket(path, "POST", "/v1/admin/models/piper/load", json_type, b"{}")[0] == 202
            assert get(addr, "/livez") == (200, "") and get(addr, "/health") == (200, "")  # probes stay open
        assert not os.path.exists(path)  # removed when the server stops


def test_a_stale_admin_socket_is_replaced_and_a_live_one_or_a_file_is_refused() -> None:
    from gateway.server import bind_admin_socket

    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = os.path.join(d, "admin.sock")
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(path)
        dead.close()  # a crashed server's: the file stays, nobody listens
        live = bind_admin_socket(path)
        try:
            with pytest.raises(OSError, match="another server"):
                bind_admin_socket(path)
        finally:
            live.close()
        other = os.path.join(d, "notes.txt")
        Path(other).write_text("mine")
        with pytest.raises(OSError, match="not a socket"):
            bind_admin_socket(other)
        assert Path(other).read_text() == "mine"


# -- through the shipped proxies, and from web pages, with a canary beside -------------------------


@dataclass
class Fronted:
    addr: str  # the server itself
    nginx: Nginx
    haproxy: HAProxy
    logdir: Path


@pytest.fixture(scope="module")
def fronted(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronted]:
    """The server (keyless loopback admin opted in), behind deploy/nginx.conf and deploy/haproxy.cfg."""
    logdir = Path(tmp_path_factory.mktemp("proxies"))
    for addr in serve(piper_engine):
        nginx, haproxy = Nginx(addr, addr, logdir), HAProxy(addr, addr, logdir)
        try:
            nginx.wait_up()
            haproxy.wait_up()
            yield Fronted(addr, nginx, haproxy, logdir)
        finally:
            nginx.stop()
            haproxy.stop()


async def test_the_shipped_proxies_never_reach_the_admin_plane_or_metrics(fronted: Fronted) -> None:
    # Before: 200 through both, with every model's record and every tenant's traffic.
    proxies = f"nginx=http://{fronted.nginx.addr},haproxy=http://{fronted.haproxy.addr}"
    r = await run(f"http://{fronted.addr}", "admin_via_proxies", proxies=proxies, rounds=50)
    assert r.seen and all(statuses == ["404"] for statuses in r.seen.values()), r.seen
    assert_undisturbed(r)
    # Spelled as the gateway would still route them (repeated slashes, percent-encoding): refused too.
    for proxy in (fronted.nginx.addr, fronted.haproxy.addr):
        for path in ("//v1/%61dmin/models", "/v1//admin%2fmodels", "/%6detrics", "/metrics/"):
            assert get(proxy, path)[0] == 404, (proxy, path)
    # And were a proxy to pass one on, it says it forwarded the request: the gateway refuses it.
    assert get(fronted.addr, "/v1/admin/models", {"X-Forwarded-For": "203.0.113.9"}) == (403, "admin_loopback_only")
    assert get(fronted.addr, "/v1/admin/models") == (200, "")  # the opt-in, straight from loopback


async def test_a_web_page_cannot_reach_the_admin_plane_metrics_or_the_open_api(fronted: Fronted) -> None:
    # Before: a text/plain POST from any page loaded models (202), a rebound Host read every answer (200).
    r = await run(f"http://{fronted.addr}", "cross_site_requests", rounds=50)
    assert r.seen == {
        "admin text/plain from a foreign page": ["403 origin_not_allowed"],
        "admin text/plain": ["415 unsupported_media_type"],
        "admin cross-site fetch": ["403 origin_not_allowed"],
        "admin rebound Host": ["403 host_not_allowed"],
        "metrics rebound Host": ["403 host_not_allowed"],
        "api rebound Host": ["403 host_not_allowed"],
        "speech text/plain from a foreign page": ["403 origin_not_allowed"],
        "api from the server's own page": ["200"],
    }, r.seen
    assert_undisturbed(r)


async def test_a_websocket_from_a_foreign_page_is_refused_and_the_playground_s_is_not(fronted: Fronted) -> None:
    # Before: session.ready for any Origin.
    r = await run(f"http://{fronted.addr}", "foreign_origin_ws", rounds=50)
    assert r.seen == {"foreign": ["origin_not_allowed 1008 'origin not allowed'"], "own page": ["session.ready"],
                      "no Origin": ["session.ready"]}, r.seen  # fmt: skip
    assert_undisturbed(r)
    # Through nginx too: it passes the client's Host with its port, so the playground is its own origin.
    origin = Origin(f"http://{fronted.nginx.addr}")
    async with websockets.connect(f"ws://{fronted.nginx.addr}/v1/audio/speech/stream", origin=origin) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.ready"


async def test_the_proxies_log_no_api_key(fronted: Fronted) -> None:
    # Before: HAProxy logged "GET /v1/audio/speech/stream?api_key=sk-live-… HTTP/1.1".
    secret = "sk-live-SECRET123"
    logs = {"haproxy": fronted.logdir / "haproxy.log", "nginx": fronted.logdir / "nginx.log"}
    for proxy in (fronted.haproxy.addr, fronted.nginx.addr):
        async with websockets.connect(f"ws://{proxy}/v1/audio/speech/stream?api_key={secret}&x=1") as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.ready"
    deadline = time.monotonic() + 10
    while not all("/v1/audio/speech/stream" in p.read_text() for p in logs.values()):  # written at the close
        assert time.monotonic() < deadline, {k: p.read_text()[-500:] for k, p in logs.items()}
        await asyncio.sleep(0.1)
    for name, p in logs.items():
        assert secret not in p.read_text() and "api_key" not in p.read_text(), name


# -- configured origins and hosts, keys ---------------------------------------------------------------


async def test_configured_origins_and_hosts_are_allowed(piper_engine: Engine) -> None:
    for addr in serve(piper_engine, allowed_origins="https://app.example.com", allowed_hosts="tts.internal"):
        port = addr.rsplit(":", 1)[1]
        assert get(addr, "/v1/models", {"Origin": "https://app.example.com"}) == (200, "")
        assert get(addr, "/v1/models", {"Origin": "https://other.example.com"}) == (403, "origin_not_allowed")
        assert get(addr, "/v1/models", {"Host": f"tts.internal:{port}"}) == (200, "")
        assert get(addr, "/v1/models", {"Host": f"tts.internal.evil:{port}"}) == (403, "host_not_allowed")
        origin = Origin("https://app.example.com")
        async with websockets.connect(f"ws://{addr}/v1/audio/speech/stream", origin=origin) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.ready"


ADMIN, TENANT = "admin-secret", "tenant-secret"


def test_with_keys_metrics_need_the_admin_key_and_a_rebound_host_gains_nothing(piper_engine: Engine) -> None:
    for addr in serve(piper_engine, admin_key=hashlib.sha256(ADMIN.encode()).hexdigest(),
                      api_keys=f"acme={hash_api_key(TENANT)}", admin_open_loopback=False):  # fmt: skip
        port = addr.rsplit(":", 1)[1]
        assert get(addr, "/metrics") == (401, "unauthorized")  # before: 200, naming every tenant
        assert get(addr, "/metrics", {"Authorization": f"Bearer {TENANT}"}) == (401, "unauthorized")
        assert get(addr, "/metrics", {"Authorization": f"Bearer {ADMIN}"}) == (200, "")
        rebound = {"Host": f"rebind.evil.example:{port}"}  # a key is needed anyway: the page has none
        assert get(addr, "/v1/models", rebound | {"Authorization": f"Bearer {TENANT}"}) == (200, "")
        assert get(addr, "/v1/models", rebound) == (401, "unauthorized")
        assert post_json(addr, "/v1/admin/models/piper/load", {"Authorization": f"Bearer {ADMIN}"})[0] == 202


# -- the rules themselves -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),  # a program: no Origin, no Sec-Fetch-Site
        ({"sec-fetch-site": "same-origin"}, True),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"origin": "http://127.0.0.1:8000", "host": "127.0.0.1:8000"}, True),
        ({"origin": "http://LOCALHOST:8000/", "host": "localhost:8000"}, True),
        ({"origin": "http://localhost:3000", "host": "localhost:8000"}, False),  # another local server's page
        ({"origin": "https://tts.example.com", "host": "tts.example.com"}, True),  # default ports
        ({"origin": "http://tts.example.com:80", "host": "tts.example.com"}, True),
        ({"origin": "http://[::1]:8000", "host": "[::1]:8000"}, True),
        ({"origin": "null", "host": "127.0.0.1:8000"}, False),  # a sandboxed frame or a file
        ({"origin": "http://evil.example", "host": "127.0.0.1:8000"}, False),
        ({"origin": "http://evil.example"}, False),
    ],
)
def test_which_origins_are_the_server_s_own(headers: dict[str, str], allowed: bool) -> None:
    assert (origin_refusal(headers, Settings()) is None) is allowed


def test_which_hosts_are_answered_without_a_credential() -> None:
    plain, listed = Settings(), Settings(allowed_hosts="tts.internal, tts.lan:8000")
    for host in ("127.0.0.1:8000", "localhost", "app.localhost:8000", "[::1]:8000", "127.9.9.9"):
        assert host_refusal({"host": host}, plain) is None, host
    assert host_refusal({}, plain) is None  # HTTP/1.0 health checks send none
    for host in ("evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io", "10.0.0.5:8000"):
        assert host_refusal({"host": host}, plain) is not None, host
    assert host_refusal({"host": "tts.internal:8000"}, listed) is None
    assert host_refusal({"host": "tts.lan:8000"}, listed) is None and host_refusal({"host": "tts.lan:9"}, listed)
    assert host_refusal({"host": "anything"}, Settings(allowed_hosts="*")) is None
    assert origin_refusal({"origin": "https://any.example"}, Settings(allowed_origins="*")) is None


def test_origin_and_host_lists_from_toml_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "voxgate.toml"
    path.write_text('[voxgate]\nallowed_origins = ["https://a.example", "https://b.example:8443"]\n'
                    'admin_socket = "/run/voxgate/admin.sock"\n')  # fmt: skip
    s = load_settings(path, env={"VOXGATE_ALLOWED_HOSTS": "tts.internal,tts.lan", "VOXGATE_ADMIN_OPEN_LOOPBACK": "1"})
    assert s.origin_list == ("https://a.example", "https://b.example:8443")
    assert s.host_list == ("tts.internal", "tts.lan") and s.admin_open_loopback
    assert s.admin_socket == "/run/voxgate/admin.sock"
    assert not Settings().admin_open_loopback and not Settings().admin_socket  # closed by default
    with pytest.raises(ValueError, match="allowed_origins"):
        Settings(allowed_origins="evil.example")
    with pytest.raises(ValueError, match="allowed_hosts"):
        Settings(allowed_hosts="http://x/")


def test_the_cli_fails_clearly_on_an_admin_socket_path_taken_by_a_file() -> None:
    """`voxgate serve --admin-socket PATH`: the flag reaches the server, which never deletes a file."""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        taken = Path(d, "taken")
        taken.write_text("x")
        p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--model", "tiny", "--port",
                            str(free_port()), "--admin-socket", str(taken)], cwd=REPO, capture_output=True,
                           timeout=120)  # fmt: skip
        assert p.returncode != 0 and b"not a socket" in p.stderr + p.stdout, (p.stderr + p.stdout)[-2000:]
        assert taken.read_text() == "x"
