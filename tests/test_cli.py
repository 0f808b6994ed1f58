"""The `voxgate` console script, run as a user runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_voxgate_segment_streams_stdin_into_segments() -> None:
    text = "Dr. Smith will see you at 3 p.m. today. 你好，欢迎致电。请问有什么可以帮您？"
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "segment", "--granularity", "sentence"],
        input=text, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert "".join(x["text"] for x in lines) == text
    assert [x["reason"] for x in lines] == ["sentence", "sentence", "flush"]
    assert lines[0]["spoken"] == "Doctor Smith will see you at three p m today."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


# torch "not installed", as in a default install: a sitecustomize refuses every torch import.
NO_TORCH = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
'''


@pytest.mark.parametrize(("model", "says"), [
    ("/nonexistent", "'/nonexistent': no such directory"),
    ("qwen3-tts-1.7b", "'qwen3-tts-1.7b' is neither a model name (cpu, piper, kokoro, synthetic, tiny, tiny-base)"),
    ("tiny", "needs PyTorch; this install has none: pip install 'voxgate[qwen3]'"),
])  # fmt: skip
def test_serve_exits_with_one_line_when_its_only_model_cannot_load(tmp_path: Path, model: str, says: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TORCH)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "VOXGATE_CACHE": str(tmp_path)}
    port = _free_port()
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--model", model, "--port", str(port)],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.splitlines() == [f"voxgate: {run.stderr.strip().removeprefix('voxgate: ')}"], run.stderr
    assert says in run.stderr
    assert "Traceback" not in run.stderr and "loaded in" not in run.stderr + run.stdout
    assert not _listens(port), "a server was left up"


def test_a_model_that_cannot_load_beside_one_that_can_is_left_to_fail_on_health() -> None:
    from gateway.cli import _unloadable
    from gateway.settings import load_settings

    assert _unloadable(load_settings(env={}, model="synthetic,/nonexistent")) is None
    both = _unloadable(load_settings(env={}, model="/nonexistent,/nowhere"))
    assert both == "no model can load: '/nonexistent': no such directory; '/nowhere': no such directory"


def test_a_wrong_serve_flag_prints_serves_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--prot", "8001"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: voxgate serve [-h] [--host HOST] [--port PORT]"), err
    assert "voxgate serve: error: unrecognized arguments: --prot 8001" in err
