"""Shared fixtures. ``redis_server``: a real redis-server on 127.0.0.1 and a free port, for the session
store and gateway tests. A missing binary FAILS the test (never skips): CI installs the Debian package."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process without persistence that can be stopped and restarted on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not on PATH: install it (apt-get install -y redis-server)")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        assert self.binary is not None
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly",
             "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited with {self.proc.returncode} on port {self.port}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        pytest.fail(f"redis-server did not answer on port {self.port} within 10 s")

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections into the listen backlog, but nothing is ever
        answered — a Redis that hangs (a stuck disk, a swap storm, a frozen VM), not one that is down."""
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        self.paused = False  # SIGKILL ends a stopped process too
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


def pytest_configure(config: pytest.Config) -> None:
    # Under xdist, files go to the workers in the order the workers collected them (support/schedule.py),
    # not re-sorted by their test count.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only an xdist worker's collection feeds the scheduler; a one-process run keeps pytest's order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from support.schedule import heaviest_files_first

        heaviest_files_first(items)


_CPU_AT_LAST_REPORT = [time.process_time()]  # this process's CPU seconds at the previous phase's report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """VOXGATE_TEST_TIMES=PATH appends a line per test phase to PATH as it ends: nodeid, phase, wall seconds,
    xdist worker, and this process's CPU seconds since the previous phase (the in-process servers' threads
    count; a loaded box inflates the wall time, hardly the CPU). Tab-separated, one small O_APPEND write
    each, so workers share PATH and a run cut short still leaves its data (--durations prints at the end).
    support/schedule.py turns it into the files' weights."""
    path = os.environ.get("VOXGATE_TEST_TIMES")
    if path and getattr(report, "node", None) is None:  # not xdist's controller's copy of a worker's report
        now = time.process_time()
        cpu, _CPU_AT_LAST_REPORT[0] = now - _CPU_AT_LAST_REPORT[0], now
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        with open(path, "a") as f:
            f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.3f}\t{worker}\t{cpu:.3f}\n")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def piper_engine() -> Iterator[Any]:
    """The fastest real voice (English Piper joe), loaded once for every test that serves a gateway."""
    from engine import load_engine

    engine = load_engine("piper")
    yield engine
    engine.close()
