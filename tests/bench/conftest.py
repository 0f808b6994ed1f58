"""bench/ is a folder of scripts, not a package: its modules are imported from there. Also a real
gateway on loopback for the load harness's smoke test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import serve

from engine import Engine

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="module")
def piper_gateway(piper_engine: Engine) -> Iterator[str]:
    """A real gateway with the English Piper voice on a loopback port, in a thread: http://HOST:PORT."""
    for addr in serve(piper_engine):
        yield f"http://{addr}"
