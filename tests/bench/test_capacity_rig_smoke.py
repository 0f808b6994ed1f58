"""The capacity rig drives a real Connection through whole replies, pieces and chunks, and the parts
benchmark's session 25 parts run old and new to the same end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_rig_times_a_whole_reply_split_into_pieces_chunks_and_its_end() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "capacity_rig.py"), "--part", "reply", "--n", "2",
                           "--others", "4"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["us"] > 0 and out["audio_s"] > 10  # two replies, ~9 s of audio each
    split = out["split_ops"]
    assert split["piece"] > split["piece+segment"] > 0  # most pieces end no segment
    assert split["input.done"] == 2 and split["end"] == 2 and split["chunk"] > 80


def test_parts_of_session_25_run_old_and_new(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "capacity_parts.py"), "--rounds", "1",
                           "--only", "admission,chain,decode,feed,admit", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    parts = json.loads((tmp_path / "parts.json").read_text())["parts"]
    assert parts["admission"]["old_us"] > 0 and parts["chain"]["new_us"] > 0
    assert all(parts[k]["us"] > 0 for k in ("decode", "feed", "admit"))
