"""The README's first command, run as a newcomer runs it: a fresh clone, a new venv, its `pip install`
(from whatever index pip is configured with), then the installed `voxgate`. The default install carries
no torch: the gateway and the CPU voices do not use it (the Qwen3 engine's torch is the `qwen3` extra).

The install is most of the time (about 40-60 s on a loaded 2-core box with a local index): slow.
Measured sizes and times, before and after torch left the core: bench/results/install_s22.md.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL_BOUND_S = 420  # pip on a cold, loaded box; the point is the outcome, the time is reported


def readme_commands() -> list[str]:
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def _install_part(serve: str) -> str:
    """The first command up to (not including) serving, which runs until stopped."""
    head, sep, tail = serve.rpartition(" && ")
    assert sep and tail.strip() == ".venv/bin/voxgate serve", serve
    return head


@pytest.mark.slow
def test_the_readmes_first_command_installs_in_a_fresh_clone_without_torch(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "voxgate"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    install = _install_part(readme_commands()[0])
    started = time.monotonic()
    run = subprocess.run(["bash", "-c", install], cwd=clone, capture_output=True, text=True,
                         timeout=INSTALL_BOUND_S)  # fmt: skip
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    python = clone / ".venv" / "bin" / "python"
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            timeout=120, check=True).stdout.lower()  # fmt: skip
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert "torch" not in names and not any(n.startswith("nvidia-") for n in names), sorted(names)
    assert {"voxgate", "onnxruntime", "litestar"} <= names, sorted(names)
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert probe.stdout.strip() == "True", probe
    helped = subprocess.run([str(clone / ".venv" / "bin" / "voxgate"), "serve", "--help"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert helped.returncode == 0 and "--model" in helped.stdout, helped
    print(f"README install in a fresh clone: {took:.1f} s")
