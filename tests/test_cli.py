"""The `voxgate` console script, run as a user runs it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from sessions import hash_api_key

ROOT = Path(__file__).resolve().parents[1]


def test_voxgate_key_digest_prints_each_keys_digest_and_nothing_else() -> None:
    out = subprocess.run([sys.executable, "-W", "error", "-m", "gateway.cli", "key-digest", "a-key", "another"],
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    assert out.stdout.split() == [hash_api_key("a-key"), hash_api_key("another")] and not out.stderr, out.stderr


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
    ("{tmp}/half", "is an incomplete Qwen3-TTS checkpoint: no model.safetensors or model.safetensors.index.json"),
])  # fmt: skip
def test_serve_exits_with_one_line_when_its_only_model_cannot_load(tmp_path: Path, model: str, says: str) -> None:
    model = model.format(tmp=tmp_path)
    if model.endswith("/half"):  # an interrupted download: config.json and nothing else
        Path(model).mkdir()
        Path(model, "config.json").write_text("{}")
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


def test_serve_stops_saying_why_when_its_only_model_fails_to_load_in_its_engine_process(tmp_path: Path) -> None:
    """What no check before loading can see (here a config.json that is not JSON): the engine process
    fails, and the gateway, with nothing it can serve, stops instead of answering "failed" forever."""
    from engine.qwen3.serving.qwen3_engine import tiny_checkpoint

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint(), broken)
    (broken / "config.json").write_text("{not json")
    port = _free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", str(broken), "--port", str(port)]
    run = subprocess.run(cmd, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("voxgate: no model could load: model 'broken': ") and "not valid JSON" in last, last
    assert "loaded in" not in run.stderr and not _listens(port)


async def test_the_start_watch_waits_for_one_ready_model_and_otherwise_says_why_each_failed() -> None:
    from engine.types import EngineError
    from gateway.models import ModelRegistry, in_process
    from gateway.settings import ModelSpec, Settings

    def factory(spec: ModelSpec) -> object:
        if spec.kind == "broken":
            raise EngineError("model_unavailable", "its weights are\nnot there")
        return in_process(spec)

    async def watched(*specs: ModelSpec) -> str | None:
        models = ModelRegistry(list(specs), Settings(), factory)  # type: ignore[arg-type]
        models.start()
        try:
            return await asyncio.wait_for(models.start_failed(poll_s=0.01), timeout=30)
        finally:
            await models.close()

    broken, fine = ModelSpec(name="a", kind="broken"), ModelSpec(name="b", kind="synthetic")
    later = ModelSpec(name="c", kind="broken", preload=False)  # the admin plane's to load: not watched
    assert await watched(broken, fine, later) is None  # one serves: the other keeps its "failed" on /health
    said = await watched(broken, ModelSpec(name="d", kind="broken"), later)
    assert said == ("model 'a': EngineError: its weights are not there; "
                    "model 'd': EngineError: its weights are not there")  # fmt: skip
