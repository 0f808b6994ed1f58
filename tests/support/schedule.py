"""The order in which the two CI workers (scripts/test: `-n 2 --dist loadfile`) take the test files: the
heaviest first, so the run's tail is many short files the workers share, not one long file one worker runs
while the other idles (longest-processing-time-first scheduling).

xdist's own order for loadfile is by test count, most first, which is nearly the opposite: the end-to-end
files (a fresh clone's pip install, replica processes, a browser) have few tests and went last. The weights
are each file's measured seconds, in file_seconds.json beside this module; a file not in it weighs by its
tests (`SLOW_TEST_S` for each marked `slow`, `DEFAULT_TEST_S` for the others), so a new file needs no entry.
Refresh the table from a run (on a box like CI's: its numbers are only compared with each other):

    VOXGATE_TEST_TIMES=/tmp/times.tsv scripts/test
    python tests/support/schedule.py /tmp/times.tsv > tests/support/file_seconds.json
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WEIGHTS = Path(__file__).with_name("file_seconds.json")
DEFAULT_TEST_S = 0.5  # an unmeasured test's weight: most of the suite's tests take well under a second
SLOW_TEST_S = 20.0  # an unmeasured `slow` test's: the end-to-end ones take 10-60 s on CI's box


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def heaviest_files_first(items: list[Any], weights: dict[str, float] | None = None) -> None:
    """Reorder `items` (pytest items, in place) by their file's weight, heaviest first. The sort is
    stable: the tests of one file keep their order (module fixtures and warm-ups rely on it)."""
    if weights is None:
        weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    guessed: collections.Counter[str] = collections.Counter()
    for item in items:
        guessed[file_of(item.nodeid)] += SLOW_TEST_S if item.get_closest_marker("slow") else DEFAULT_TEST_S
    items.sort(key=lambda item: -weights.get(file_of(item.nodeid), guessed[file_of(item.nodeid)]))


def file_seconds(lines: Sequence[str]) -> dict[str, float]:
    """Seconds per file from VOXGATE_TEST_TIMES lines (nodeid, phase, seconds, worker; tab-separated); a
    phase logged twice counts once (the last)."""
    phases: dict[tuple[str, str], float] = {}
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) >= 3:
            phases[(parts[0], parts[1])] = float(parts[2])
    per_file: collections.Counter[str] = collections.Counter()
    for (nodeid, _), s in phases.items():
        per_file[file_of(nodeid)] += s
    return {f: round(s, 1) for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    print(json.dumps(file_seconds(Path(sys.argv[1]).read_text().splitlines()), indent=1))
