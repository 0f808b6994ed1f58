"""The size rules of issue 41, measured on the source with `ast`, so a room that outgrows its shape fails
here rather than in the next review: no package module over 600 lines, no function over 60, the Qwen3
core at most 600 lines and 30 methods, and its step a straight line of named calls."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gateway", "sessions", "segmentation", "voxgate_client")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
CORE = "engine/qwen3/serving/core.py"
MAX_CORE_METHODS = 30
MAX_STEP_COMPLEXITY = 6
# A module being split by another change, named with that change; each entry goes when it lands, and a
# stale one fails (test_allowances_are_still_needed) so none outlives its reason.
ALLOWED_LONG_MODULES: dict[str, str] = {}

# Branch points of McCabe's count, and then some: a boolean operator counts once per extra operand.
_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case,
             ast.comprehension, ast.Assert)


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """1 + the branch points of `fn`'s own body (nested functions are their own)."""
    count, todo = 1, list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, _BRANCHES):
            count += 1
        if isinstance(node, ast.comprehension):
            count += len(node.ifs)
        if isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        todo.extend(ast.iter_child_nodes(node))
    return count


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_no_package_module_is_over_600_lines() -> None:
    long = {_rel(p): n for p in _modules() if (n := _lines(p)) > MAX_MODULE_LINES}
    assert set(long) <= set(ALLOWED_LONG_MODULES), (
        f"modules over {MAX_MODULE_LINES} lines (split them along a real seam): "
        f"{ {k: v for k, v in long.items() if k not in ALLOWED_LONG_MODULES} }")


def test_allowances_are_still_needed() -> None:
    done = [m for m in ALLOWED_LONG_MODULES if not (ROOT / m).exists() or _lines(ROOT / m) <= MAX_MODULE_LINES]
    assert not done, f"these modules are now within {MAX_MODULE_LINES} lines: drop their allowance: {done}"


def test_no_package_function_is_over_60_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{_rel(path)}:{node.lineno} {node.name} {n}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_qwen3_core_stays_small() -> None:
    path = ROOT / CORE
    assert _lines(path) <= MAX_MODULE_LINES
    core = _class(_tree(path), "EngineCore")
    methods = [n.name for n in core.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert len(methods) <= MAX_CORE_METHODS, f"EngineCore has {len(methods)} methods: {methods}"


def test_the_core_step_is_plan_execute_update() -> None:
    cycle = _method(_class(_tree(ROOT / CORE), "EngineCore"), "_cycle")
    assert complexity(cycle) <= MAX_STEP_COMPLEXITY
    calls = [ast.unparse(n.func) for n in ast.walk(cycle) if isinstance(n, ast.Call)]
    assert {"self.scheduler.plan", "self._execute", "self._update"} <= set(calls), calls


@pytest.mark.parametrize(("source", "expected"), [
    ("def f():\n    return 1\n", 1),
    ("def f(a, b):\n    if a and b:\n        return 1\n    for x in a:\n        pass\n", 4),
    ("def f(a):\n    try:\n        pass\n    except ValueError:\n        pass\n"
     "    return [x for x in a if x]\n", 4),
    ("def f(a):\n    def g():\n        if a:\n            pass\n    return g\n", 1),
])
def test_complexity_counts_branch_points(source: str, expected: int) -> None:
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert complexity(fn) == expected
