"""A real gateway (Piper voice, which serves the playground at /) on a loopback port, in a thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.servers import serve

from engine import Engine


@pytest.fixture(scope="module")
def playground_server(piper_engine: Engine) -> Iterator[str]:
    for addr in serve(piper_engine):
        yield f"http://{addr}"
