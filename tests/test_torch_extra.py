"""torch belongs to the Qwen3 engine (the `qwen3` extra), not to the gateway: a default install serves the
CPU voices without it, and a Qwen3 model asked of such an install says which install it needs.

torch is installed in the test environment (dev brings the `qwen3` extra), so "not installed" is made
real in a child interpreter: a `sitecustomize` on its PYTHONPATH puts a meta-path finder first that
refuses every `torch` import and writes each attempt to a file. The engine processes `voxgate serve`
starts are fresh interpreters with the same environment, so the finder holds there too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.http import free_port, get, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install 'voxgate[qwen3]'"

BLOCKER = '''
import os, sys, traceback

class _NoTorch:
    """torch is not installed, as in a default install; every attempt is written down."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            with open(os.environ["NO_TORCH_LOG"], "a") as log:
                log.write(f"{os.getpid()} {name}\\n" + "".join(traceback.format_stack(limit=8)))
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
'''


@pytest.fixture
def no_torch_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    attempts = tmp_path / "torch_imports.log"
    attempts.touch()
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "NO_TORCH_LOG": str(attempts),
                        "VOXGATE_CACHE": str(tmp_path / "cache")}  # fmt: skip
    yield env, attempts




def test_the_default_install_has_no_torch_and_the_engines_that_need_it_bring_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["qwen3"]
    assert "voxgate[qwen3]" in extras["vllm"]
    assert any("qwen3" in d for d in extras["dev"] if d.startswith("voxgate[")), "the test suite needs torch"


def test_the_blocker_really_blocks_torch(no_torch_env: tuple[dict[str, str], Path]) -> None:
    env, attempts = no_torch_env
    run = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "No module named 'torch'" in run.stderr
    assert "torch" in attempts.read_text()


@pytest.mark.parametrize(("model", "says"), [
    ("tiny", f"needs PyTorch; this install has none: {INSTALL}"),
    ("tiny-base", INSTALL),
    ("qwen3-tts-1.7b", "is neither a model name"),  # a typo: installing torch would not help it
])  # fmt: skip
def test_a_qwen3_model_without_torch_is_unavailable_naming_the_install(
    no_torch_env: tuple[dict[str, str], Path], model: str, says: str
) -> None:
    env, _ = no_torch_env
    code = ("import json\nfrom engine.loader import load_engine\nfrom engine.types import EngineError\n"
            f"try:\n    load_engine({model!r})\nexcept EngineError as e:\n"
            "    print(json.dumps({'code': e.code, 'message': str(e)}))\n")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said["code"] == "model_unavailable", said
    assert says in said["message"], said


@pytest.mark.slow
def test_serving_the_cpu_voices_never_imports_torch(no_torch_env: tuple[dict[str, str], Path]) -> None:
    """`voxgate serve --model cpu` as the README runs it (the engine in a child process), then a speech
    request: no process of it ever tries to import torch."""
    pytest.importorskip("onnxruntime")  # the cpu extra
    env, attempts = no_torch_env
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--model", "cpu", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        status, _ = wait_healthy(server, port, within_s=180)
        assert status == 200, f"the gateway did not get healthy (exit {server.poll()})"
        body = json.dumps({"model": "tts-1", "voice": "joe", "input": "Hello there.", "response_format": "wav"})
        status, audio = get(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=60, data=body.encode())
        assert status == 200 and audio[:4] == b"RIFF" and len(audio) > 10_000, (status, audio[:200])
    finally:
        server.terminate()
        try:
            _, err = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            _, err = server.communicate(timeout=10)
    assert attempts.read_text() == "", f"torch was imported:\n{attempts.read_text()[:3000]}"
    assert "No module named 'torch'" not in err, err[-3000:]
