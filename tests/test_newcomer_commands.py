"""A newcomer's two commands: the README's test command is the one `.ci/run` runs, and it sets up what
the tests need (`scripts/test` installs redis-server, Chromium and its driver when they are missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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
