"""The example agents run against a real gateway, as a user would run them."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "agents" / "streaming_agent.py"


def run_agent(gateway: str, out: Path, *extra: str) -> str:
    cmd = [sys.executable, str(AGENT), "--url", f"ws://{gateway}/v1/audio/speech/stream", "--out", str(out), *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout


def test_streaming_agent_holds_a_multi_turn_session(gateway: str, tmp_path: Path) -> None:
    out = run_agent(gateway, tmp_path, "--turns", "2", "--rate", "40")
    assert out.count("ttfa") == 2 and "barged" not in out
    for i in range(2):
        with wave.open(str(tmp_path / f"turn-{i}.wav")) as w:
            assert w.getnframes() / w.getframerate() > 1.0


def test_streaming_agent_barges_in(gateway: str, tmp_path: Path) -> None:
    out = run_agent(gateway, tmp_path, "--turns", "2", "--rate", "40", "--barge-in", "0.05")
    assert out.count("barged in") == 2, out


def test_streaming_agent_barges_in_on_playback_time(gateway: str, tmp_path: Path) -> None:
    # A fast LLM: the whole English reply (~5 s of speech) arrives within a second or so, long before
    # its playback reaches 1 s; the barge-in still comes 1 s into what the listener hears.
    out = run_agent(gateway, tmp_path, "--turns", "1", "--rate", "1000", "--barge-in", "1.0")
    assert "barged in, heard 'Sure, I can help with that." in out, out
    with wave.open(str(tmp_path / "turn-0.wav")) as w:
        assert 0.8 < w.getnframes() / w.getframerate() < 1.6, w.getnframes()
