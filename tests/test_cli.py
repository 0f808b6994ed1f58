"""The `voxgate` console script, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys


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
