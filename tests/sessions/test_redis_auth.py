"""A password-protected Redis, as deploy/compose.yaml runs it: the primary and its replica with
`requirepass` and `masterauth`, a sentinel with `sentinel auth-pass` and a `requirepass` of its own. The
store reaches it with the URL forms the compose file gives the replicas, and is refused without them."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions import SessionStore, StateUnavailable

from ..support.redis_topologies import free_port

pytestmark = [pytest.mark.redis]
PASSWORD, SENTINEL_PASSWORD = "s3cret-redis", "s3cret-sentinel"


def _answers(port: int, password: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            time.sleep(0.05)
            return b"+PONG" in s.recv(64)
    except OSError:
        return False


class AuthedSentinelSet:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server") or pytest.fail("redis-server is not installed")
        self.procs: list[subprocess.Popen[bytes]] = []
        auth = ["--requirepass", PASSWORD, "--masterauth", PASSWORD]
        self.primary, replica, self.sentinel = free_port(), free_port(), free_port()

        def start(port: int, *args: str, password: str = PASSWORD) -> None:
            d = workdir / str(port)
            d.mkdir()
            argv = [binary, *args, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", str(d)]
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 10
            while not _answers(port, password):
                assert time.monotonic() < deadline, f"redis on {port} did not answer"
                time.sleep(0.05)

        start(self.primary, *auth)
        start(replica, *auth, "--replicaof", "127.0.0.1", str(self.primary))
        conf = workdir / "sentinel.conf"
        conf.write_text(f"sentinel monitor voxgate 127.0.0.1 {self.primary} 1\n"
                        f"sentinel auth-pass voxgate {PASSWORD}\nrequirepass {SENTINEL_PASSWORD}\n")  # fmt: skip
        start(self.sentinel, str(conf), "--sentinel", password=SENTINEL_PASSWORD)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(5)


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[AuthedSentinelSet]:
    s = AuthedSentinelSet(tmp_path)
    try:
        yield s
    finally:
        s.stop()


async def _reaches(url: str) -> bool:
    store = SessionStore.from_url(url)
    try:
        await store.start()
        return store.health().status == "ok"
    except StateUnavailable:
        return False
    finally:
        await store.close()


async def test_the_store_reaches_a_password_protected_redis_only_with_its_password(authed: AuthedSentinelSet) -> None:
    sentinels = f"127.0.0.1:{authed.sentinel}"
    assert await _reaches(f"redis+sentinel://:{PASSWORD}@{sentinels}/voxgate?sentinel_password={SENTINEL_PASSWORD}")
    assert await _reaches(f"redis://:{PASSWORD}@127.0.0.1:{authed.primary}/0")
    assert not await _reaches(f"redis://127.0.0.1:{authed.primary}/0")
    assert not await _reaches(f"redis+sentinel://{sentinels}/voxgate?sentinel_password={SENTINEL_PASSWORD}")
    assert not await _reaches(f"redis+sentinel://:{PASSWORD}@{sentinels}/voxgate")  # the sentinel's own too
