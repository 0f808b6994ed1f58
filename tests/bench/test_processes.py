"""bench/processes.py's stop: a child that exits on SIGTERM is reaped with its status; one that ignores
it is killed once its grace passes (a stuck server must not hang a bench or a fixture's teardown)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from processes import stop

IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(60)")


def test_a_child_that_exits_on_sigterm_is_reaped_with_its_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop(proc, grace_s=20) == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_its_grace() -> None:
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is in place
    t0 = time.monotonic()
    assert stop(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 < 15  # the grace, then the kill's reaping (generous for a loaded box)
    proc.stdout.close()


def test_a_child_already_gone_is_only_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    assert stop(proc, grace_s=1) == 0
