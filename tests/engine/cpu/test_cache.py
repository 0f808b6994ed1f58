"""The CPU voices write only inside voxgate's cache, never the user's home by surprise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu.cache import cache_dir

REPO = Path(__file__).resolve().parents[3]


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VOXGATE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "voxgate"
    monkeypatch.setenv("VOXGATE_CACHE", str(tmp_path / "vg"))
    assert cache_dir() == tmp_path / "vg"
    assert cache_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert (tmp_path / "explicit").is_dir()


def test_loading_the_cpu_voices_writes_nothing_outside_the_cache(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    home, cache, tmp = tmp_path / "home", tmp_path / "cache", tmp_path / "tmp"
    for d in (home, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "VOXGATE_CACHE", "ORT_DISABLE_TELEMETRY")}
    env.update(HOME=str(home), TMPDIR=str(tmp), VOXGATE_CACHE=str(cache), PYTHONPATH=str(REPO))
    code = "from engine import load_engine; load_engine('cpu', warmup=False).close()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120, cwd=tmp_path)
    assert list(home.rglob("*")) == [], "something wrote into the user's home"
    assert list(tmp.rglob("*")) == [], "something wrote into the temp dir (jieba's cache belongs in ours)"
    assert (cache / "kokoro" / "kokoro-v1.0.int8.onnx").is_file()
