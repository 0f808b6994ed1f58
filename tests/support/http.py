"""Plain-stdlib HTTP for tests that start `voxgate serve` as a process (no gateway import in the test's
own process: the torch-free checks watch what it imports)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, data: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET, or of a JSON POST when `data` is given; an HTTP error is a status too."""
    headers = {"content-type": "application/json"} if data else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(server: subprocess.Popen[str], port: int, within_s: float) -> tuple[int, bytes]:
    """Poll the server's /health until it answers 200, the process exits, or `within_s` passes: the last
    (status, body), status 0 where nothing answered."""
    deadline, status, body = time.monotonic() + within_s, 0, b""
    while time.monotonic() < deadline and server.poll() is None:
        try:
            status, body = get(f"http://127.0.0.1:{port}/health", timeout=2)
        except OSError:
            status = 0
        if status == 200:
            break
        time.sleep(0.2)
    return status, body
