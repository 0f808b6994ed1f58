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
    """A real gateway with the English Piper voice on a loopback port, in a thread: http://HOST:PORT. The
    first-audio SLO is off: the smoke runs check the harnesses' figures, and on a loaded box the voice's
    measured capacity can fall to one stream, where the SLO would rightly refuse the second."""
    for addr in serve(piper_engine, first_audio_slo_s=0):
        yield f"http://{addr}"
