"""Real Redis topologies on loopback for tests: a three-primary Cluster, and a primary with a replica
watched by a Sentinel. Debian's redis-server runs all of them (``redis-server --sentinel`` is the
sentinel); a missing binary fails the test, as for the plain ``redis_server`` fixture."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail("redis-server is not on PATH: install it (apt-get install -y redis-server)")
    return path


def command(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """One command over a raw socket (no client library: the fixture must not depend on what it tests)."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = s.recv(65536)
        s.settimeout(0.05)  # the rest of a long reply follows at once: read until the line goes quiet
        try:
            while chunk := s.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        return data


_STARTED: list[Node] = []  # every node of this process: a fixture that fails half-way kills its own


def kill_since(mark: int) -> None:
    for node in _STARTED[mark:]:
        node.kill()


def _wait(what: str, ok: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail(f"{what} within {timeout} s")


class Node:
    """One redis-server (or sentinel) process; ``kill()`` is kill -9."""

    def __init__(self, workdir: Path, *args: str, port: int | None = None, conf: str | None = None) -> None:
        self.port = port or free_port()
        self.dir = workdir / str(self.port)
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [_binary()]
        if conf is not None:  # a sentinel rewrites its config file: it needs one of its own
            (self.dir / "sentinel.conf").write_text(conf)
            argv += [str(self.dir / "sentinel.conf"), "--sentinel"]
        argv += ["--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                 "--dir", str(self.dir), *args]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _STARTED.append(self)
        _wait(f"redis on {self.port} did not answer", lambda: command(self.port, "PING").startswith(b"+PONG"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class Cluster:
    """Three primaries, each with a third of the slots (CLUSTER ADDSLOTSRANGE + MEET: no redis-cli)."""

    def __init__(self, workdir: Path, primaries: int = 3, *, replica: bool = False) -> None:
        self.replica: Node | None = None
        mark = len(_STARTED)
        try:
            self._start(workdir, primaries, replica)
        except BaseException:
            kill_since(mark)
            raise

    def _start(self, workdir: Path, primaries: int, replica: bool) -> None:
        # The bus port is named: its default (port + 10000) fails for the high ports free_port() gives.
        self.bus = [free_port() for _ in range(primaries)]
        self.nodes = [Node(workdir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                           "--cluster-node-timeout", "2000", "--cluster-port", str(bus))
                      for bus in self.bus]  # fmt: skip
        step = 16384 // primaries
        for i, n in enumerate(self.nodes):
            hi = 16383 if i == primaries - 1 else (i + 1) * step - 1
            assert command(n.port, "CLUSTER", "ADDSLOTSRANGE", str(i * step), str(hi)).startswith(b"+OK")
        for n in self.nodes[1:]:
            command(n.port, "CLUSTER", "MEET", "127.0.0.1", str(self.nodes[0].port), str(self.bus[0]))
        for n in self.nodes:
            _wait("the cluster did not form", lambda n=n: b"cluster_state:ok" in command(n.port, "CLUSTER", "INFO"))
        if replica:  # one replica, of the first primary: acknowledged writes to its slots WAIT for it
            bus = free_port()
            r = Node(workdir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000", "--cluster-port", str(bus), "--repl-diskless-sync-delay", "0")
            command(r.port, "CLUSTER", "MEET", "127.0.0.1", str(self.nodes[0].port), str(self.bus[0]))
            primary_id = command(self.nodes[0].port, "CLUSTER", "MYID").split(b"\r\n")[1].decode()
            _wait("the replica did not join", lambda: command(r.port, "CLUSTER", "REPLICATE", primary_id)
                  .startswith(b"+OK"))  # fmt: skip
            _wait("the replica did not sync", lambda: b"master_link_status:up" in command(r.port, "INFO",
                                                                                         "replication"))  # fmt: skip
            self.replica = r
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for n in [*self.nodes, *([self.replica] if self.replica else [])]:
            n.kill()


class SentinelSet:
    """A primary, one replica and one sentinel (quorum 1: it fails over alone) that notices a dead
    primary after ``down_after_ms``."""

    MASTER = "voxgate"

    def __init__(
        self, workdir: Path, down_after_ms: int = 400, *, failover_ready: bool = False,
        primary_args: tuple[str, ...] = (),  # e.g. a primary that cannot be demoted (REPLICAOF renamed)
    ) -> None:
        mark = len(_STARTED)
        try:
            self._start(workdir, down_after_ms, failover_ready, primary_args)
        except BaseException:
            kill_since(mark)
            raise

    def _start(self, workdir: Path, down_after_ms: int, failover_ready: bool, primary_args: tuple[str, ...]) -> None:
        # No 5 s wait for more replicas before a full sync (Redis 7's default for diskless sync).
        self.primary = Node(workdir, "--repl-diskless-sync-delay", "0", *primary_args)
        self.replica = Node(workdir, "--replicaof", "127.0.0.1", str(self.primary.port),
                            "--repl-diskless-sync-delay", "0")  # fmt: skip
        _wait("the replica did not sync", lambda: b"master_link_status:up" in command(self.replica.port, "INFO",
                                                                                     "replication"))  # fmt: skip
        conf = (f"sentinel monitor {self.MASTER} 127.0.0.1 {self.primary.port} 1\n"
                f"sentinel down-after-milliseconds {self.MASTER} {down_after_ms}\n"
                f"sentinel failover-timeout {self.MASTER} 2000\n"
                # Named up front: otherwise it learns of the replica from the primary's INFO, up to 10 s on.
                f"sentinel known-replica {self.MASTER} 127.0.0.1 {self.replica.port}\n")  # fmt: skip
        self.sentinel = Node(workdir, conf=conf)
        if failover_ready:  # it can promote the replica once it has seen it in the primary's INFO (~5 s)
            self.await_replica()
        self.url = f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.MASTER}"

    def await_replica(self) -> None:
        _wait("the sentinel did not find the replica", lambda: f"{self.replica.port}".encode() in command(
            self.sentinel.port, "SENTINEL", "REPLICAS", self.MASTER), timeout=15)  # fmt: skip

    def master_port(self) -> int:
        reply = command(self.sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER)
        return int(reply.split(b"\r\n")[-2])

    def stop(self) -> None:
        for n in (self.sentinel, self.replica, self.primary):
            n.kill()


def flushall(*ports: int) -> None:
    for port in ports:
        assert command(port, "FLUSHALL").startswith(b"+OK")
