"""A newcomer's two commands: the README's test command is the one `.ci/run` runs, and it sets up what
the tests need (`scripts/test` installs redis-server, Chromium and its driver when they are missing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readmes_test_command_exactly() -> None:
    serve, test = readme_commands()[:2]
    assert serve.endswith("voxgate serve") and test.endswith("scripts/test"), (serve, test)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, "the README's test command must be a line of .ci/run"


def test_the_test_command_names_what_it_would_install_on_a_bare_machine(tmp_path: Path) -> None:
    bare = tmp_path / "bin"  # a PATH with a shell and nothing the tests need
    bare.mkdir()
    for tool in ("bash", "env", "id", "dirname"):
        if found := shutil.which(tool):
            (bare / tool).symlink_to(found)
    run = subprocess.run(["bash", str(ROOT / "scripts" / "test"), "--co"], capture_output=True, text=True,
                         env={"PATH": str(bare), "VOXGATE_TEST_NO_INSTALL": "1", "HOME": os.environ.get("HOME", "/")},
                         timeout=30)  # fmt: skip
    assert run.returncode == 1, run
    assert "redis-server chromium chromium-driver" in run.stderr, run.stderr


def test_ci_checks_the_layering_and_it_holds() -> None:
    assert any(line.startswith(".venv/bin/lint-imports") for line in (ROOT / ".ci" / "run").read_text().splitlines())
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]


def user_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]


def test_the_docs_rely_on_nothing_outside_the_repository() -> None:
    """A page that cites a design note beside the checkout (DESIGN §5, ../shared/…) sends a newcomer to a
    file that a clone does not have: what the docs rely on lives in docs/."""
    cited = {
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in user_pages()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bDESIGN\b|\.\./shared|\bshared/(DESIGN|research|corpus)", line)
    }
    assert not cited, "\n".join(sorted(cited))


# `python …` or `voxgate …` typed in a fresh clone after the README's install finds neither the venv's
# interpreter nor its packages (ModuleNotFoundError: websockets): commands name `.venv/bin/…`.
BARE_PYTHON = re.compile(r"(?<![\w/.-])python3?\s+(?!-m venv\b)")
BARE_LINE = re.compile(r"^\s*(?:\$\s*)?(?:voxgate|pip3?)\s")  # a command line of a code block or usage
BARE_SPAN = re.compile(r"^(?:voxgate\s+\w+\s+-|pip3?\s+install\s)")  # in prose: with flags, not just the name
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
# Pages whose commands run elsewhere than a clone (none today).
CHECKED_ELSEWHERE: set[str] = set()


def shell_commands(page: Path) -> Iterator[tuple[int, str, re.Pattern[str]]]:
    """(line, command, what a bare command looks like there) of every shell command a page shows: a line
    of a shell code block, an inline code span, and in an example's docstring an indented usage line."""
    fence: str | None = None
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if page.suffix == ".py":
            if re.match(r"^\s+(?:\.venv/bin/|python|voxgate|pip)", line):
                yield n, line, BARE_LINE
            continue
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:].strip() if fence is None else None
            continue
        if fence is not None:
            if fence in SHELL_FENCES:
                yield n, line, BARE_LINE
            continue
        yield from ((n, span, BARE_SPAN) for span in re.findall(r"`([^`\n]+)`", line))


def test_every_command_the_docs_show_runs_from_the_venv() -> None:
    pages = [p for p in (*user_pages(), *sorted((ROOT / "examples").rglob("*.py")))
             if str(p.relative_to(ROOT)) not in CHECKED_ELSEWHERE]  # fmt: skip
    bare = [f"{page.relative_to(ROOT)}:{n}: {command.strip()}"
            for page in pages for n, command, bare_form in shell_commands(page)
            if BARE_PYTHON.search(command) or bare_form.match(command)]  # fmt: skip
    assert not bare, "use .venv/bin/python (or .venv/bin/voxgate), as after the README's install:\n" + "\n".join(bare)


def test_the_readmes_segment_command_prints_the_segments() -> None:
    """The README shows `voxgate segment`, which `voxgate --help` lists: it runs as shown."""
    shown = next(s for s in re.findall(r"`([^`\n]+)`", (ROOT / "README.md").read_text()) if "voxgate segment" in s)
    text = re.search(r'echo "([^"]+)"', shown)
    assert text is not None, shown
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "segment"], input=text[1], capture_output=True,
                         text=True, cwd=ROOT, timeout=120, check=True)  # fmt: skip
    segments = [json.loads(line) for line in run.stdout.splitlines()]
    assert "".join(s["text"] for s in segments) == text[1] and len(segments) == 2, segments
