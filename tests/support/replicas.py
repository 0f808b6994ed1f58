"""`voxgate serve` processes for tests, started as deploy/ starts them, and HAProxy in front of them
with deploy/haproxy.cfg itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .servers import free_port

REPO = Path(__file__).resolve().parents[2]


class Replica:
    """One `voxgate serve --model piper` (or `model`) process on a free port; an empty `redis_url`: the
    embedded store. ``spawn`` does not wait: start several, then ``wait_healthy`` each (a piper replica
    takes ~8 s to warm up; in parallel they overlap)."""

    def __init__(self, redis_url: str, logdir: Path, *extra: str, port: int | None = None,
                 model: str = "piper") -> None:  # fmt: skip
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        store = ["--redis-url", redis_url] if redis_url else []
        self.cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", model, "--port", str(self.port),
                    *store, *extra]  # fmt: skip
        self.log = logdir / f"replica-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> Replica:
        out = open(self.log, "ab")  # noqa: SIM115 - the process holds it
        # The first-audio SLO is off unless a test turns it on (--first-audio-slo): on a shared box the voice's
        # measured capacity falls with the load, and the SLO would rightly refuse what a test means to serve.
        env = {"VOXGATE_FIRST_AUDIO_SLO_S": "0"} | os.environ | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        return self

    def wait_healthy(self, timeout: float = 90) -> Replica:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.addr}/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "replica did not become healthy"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _installed(name: str) -> str:
    binary = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if binary is None:
        pytest.fail(f"{name} is not installed: apt-get install -y {name} (scripts/test does)")
    return binary


class _Balancer:
    """A load balancer process in front of two replicas, on `addr`."""

    name: str
    addr: str
    proc: subprocess.Popen[bytes]

    def exited(self) -> str:
        """What to show when the process has exited."""
        return f"{self.name} exited"

    def wait_up(self, timeout: float = 10) -> None:
        """Until both replicas are in rotation (its /health answers 200 through it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.exited()
            try:
                with urllib.request.urlopen(f"http://{self.addr}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        pytest.fail(f"{self.name} did not answer /health")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


class HAProxy(_Balancer):
    """deploy/haproxy.cfg, as is, in front of two replicas."""

    name = "haproxy"

    def __init__(self, a: str, b: str, logdir: Path) -> None:
        binary = _installed("haproxy")
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        env = os.environ | {"VOXGATE_LISTEN": self.addr, "VOXGATE_REPLICA_A": a, "VOXGATE_REPLICA_B": b}
        out = open(logdir / "haproxy.log", "ab")  # noqa: SIM115 - the process holds it
        self.proc = subprocess.Popen([binary, "-db", "-f", str(REPO / "deploy" / "haproxy.cfg")], env=env,
                                     stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


class Nginx(_Balancer):
    """deploy/nginx.conf in front of two replicas: the same file with its upstream addresses and port
    substituted, included in a minimal main configuration of its own (one process, files under logdir)."""

    name = "nginx"

    def __init__(self, a: str, b: str, logdir: Path) -> None:
        binary = _installed("nginx")
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        site = (REPO / "deploy" / "nginx.conf").read_text()
        for old, new in (("voxgate-1:8000", a), ("voxgate-2:8000", b), ("listen 8000;", f"listen {self.addr};")):
            assert old in site, f"deploy/nginx.conf no longer has {old!r}"
            site = site.replace(old, new)
        prefix = logdir / f"nginx-{self.port}"
        prefix.mkdir()
        (prefix / "site.conf").write_text(site)
        temp = " ".join(f"{kind}_temp_path {prefix}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                          "scgi"))  # fmt: skip
        (prefix / "nginx.conf").write_text(
            f"daemon off; master_process off; worker_processes 1; pid {prefix}/nginx.pid;\n"
            f"error_log {prefix}/error.log;\nevents {{ worker_connections 256; }}\n"
            f"http {{ access_log off; {temp} include {prefix}/site.conf; }}\n"
        )
        out = open(logdir / "nginx.log", "ab")  # noqa: SIM115 - the process holds it
        self.proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf")], stdout=out,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        self._prefix = prefix

    def exited(self) -> str:
        return (self._prefix / "error.log").read_text()[-2000:]


class TwoReplicas:
    """Two replicas on one store (`redis_url`) behind both shipped balancers, each started from its file:
    the deployment the balancer and overflow tests speak through. `extra` and `model` go to both
    replicas (`Replica`); `balancers` by name. A part that does not come up stops those that did."""

    def __init__(self, redis_url: str, logdir: Path, *extra: str, model: str = "piper",
                 timeout: float = 90) -> None:  # fmt: skip
        self.replicas = [Replica(redis_url, logdir, *extra, model=model) for _ in range(2)]
        self.balancers: dict[str, _Balancer] = {}
        try:
            for r in self.replicas:  # spawned together: their warm-ups overlap
                r.spawn()
            for r in self.replicas:
                r.wait_healthy(timeout)
            a, b = (r.addr for r in self.replicas)
            self.balancers = {"haproxy": HAProxy(a, b, logdir), "nginx": Nginx(a, b, logdir)}
            for lb in self.balancers.values():
                lb.wait_up()
        except BaseException:
            self.stop()
            raise

    @property
    def haproxy(self) -> _Balancer:
        return self.balancers["haproxy"]

    @property
    def nginx(self) -> _Balancer:
        return self.balancers["nginx"]

    def stop(self) -> None:
        for lb in self.balancers.values():
            lb.stop()
        for r in self.replicas:
            r.kill()
