"""The CPU voices' tests go through what the engine shows (`CpuStream.snapshot`, `UrgencyPool.queued`,
`CpuEngine.stream_of`, ...), never its private state: a test that reads `stream._jobs` breaks on every
change of mechanism and says nothing of behaviour."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent
# The helpers these tests wait and read through: a helper could otherwise read private state for them.
HELPERS = [HERE.parents[1] / "support" / name for name in ("streams.py", "waits.py")]


def private_uses(source: str) -> list[str]:
    """`x._name` attributes, and `setattr`/`getattr` with a "_name" string (monkeypatch's included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
              in ("setattr", "getattr", "setitem", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and node.args[1].value.startswith("_")
              and not node.args[1].value.startswith("__")):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_cpu_tests_read_no_private_attribute_of_engine_objects() -> None:
    paths = [*sorted(HERE.glob("*.py")), *HELPERS]
    assert all(p.exists() for p in HELPERS) and len(paths) > 20
    offences = {path.name: uses for path in paths if (uses := private_uses(path.read_text()))}
    assert offences == {}


def test_the_check_sees_a_private_read_and_a_private_patch() -> None:
    assert private_uses("stream._jobs\nmonkeypatch.setattr(engine, '_pool', None)\nstream.__class__") == [
        "line 1: stream._jobs", "line 2: monkeypatch.setattr(engine, '_pool', None)"]
