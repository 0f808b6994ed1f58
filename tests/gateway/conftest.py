from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.servers import serve

from engine import Engine
from gateway.connection import Limits


@pytest.fixture(scope="session")
def cpu_engine(piper_engine: Engine) -> Engine:
    return piper_engine


@pytest.fixture(scope="module")
def gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=2.0))
