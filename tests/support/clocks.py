"""A clock that moves only when a test moves it: the policies' injected clock in fake-clock tests."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds, `now`, that a test sets or advances; called like `time.monotonic`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
