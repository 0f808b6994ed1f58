"""How many streams the CPU voices can keep ahead of their listeners, from what synthesis has cost.

Every pool job reports the seconds it ran and the seconds of audio it made. Per backend (Piper and
Kokoro differ about fourfold) an EWMA of the real-time factor (RTF: run seconds per audio second) is
kept, and beside it an EWMA of each backend's share of the audio, so a mixed load is judged by what
it mixes. A stream that speaks needs about one second of audio per second, i.e. RTF worker-seconds
per second; `workers` workers keep `workers / rtf` such streams ahead, of which `headroom` is counted
(a shared box's other work, the look-ahead's bursts, the cost of text that is not speech yet).

The RTF is measured on the wall clock of each job, with whatever else ran beside it (other workers,
other processes of a shared box): what it costs under the load of the moment. A job that ran alone
had the idle cores for its intra-op threads and measures cheaper than it will with the pool full;
charging it for a full pool (cores it would lose) was tried and, on a shared box whose idle cores
other processes take anyway, halved the admitted load for no fewer gaps. A rise in cost is believed
at once instead (`alpha_up`). The knobs are `CpuPolicyConfig`'s (engine/cpu/policy.py).
Pure and thread-safe (a lock held for a few arithmetic operations); no clock of its own.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from engine.cpu.policy import DEFAULT, CpuPolicyConfig


class RtfMeter:
    def __init__(self, alpha: float = DEFAULT.alpha, prior_rtf: float = DEFAULT.prior_rtf,
                 headroom: float = DEFAULT.headroom, alpha_up: float | None = DEFAULT.alpha_up,
                 config: CpuPolicyConfig = DEFAULT) -> None:
        """`alpha_up`: the weight of a job costlier than the estimate (None: `alpha`, symmetric);
        `config`: the short-job weight and the overrun window."""
        self._config = config
        alpha_up = alpha if alpha_up is None else max(alpha, alpha_up)
        if not (0 < alpha <= 1 and alpha_up <= 1 and prior_rtf > 0 and 0 < headroom <= 1):
            raise ValueError(f"need 0 < alpha <= 1, prior_rtf > 0, 0 < headroom <= 1; got {alpha}, {prior_rtf}, "
                             f"{headroom}")
        self.alpha, self.alpha_up, self.prior_rtf, self.headroom = alpha, alpha_up, prior_rtf, headroom
        self._rtf: dict[str, float] = {}  # backend → EWMA real-time factor
        self._share: dict[str, float] = {}  # backend → EWMA of its audio seconds per job
        self._job_s = 0.0  # EWMA of one job's run time (how long a newcomer waits for a busy worker)
        self._overruns: dict[str, deque[float]] = {}  # backend → its latest runs' run time / prediction
        self._lock = threading.Lock()

    def record(self, backend: str, run_s: float, audio_s: float, predicted_s: float = 0.0) -> None:
        """One job of `backend` ran `run_s` seconds and made `audio_s` seconds of audio; `predicted_s`
        (if > 0): how long it was expected to run when it started (its `overrun`)."""
        if not (math.isfinite(run_s) and math.isfinite(audio_s)) or run_s < 0 or audio_s <= 0:
            return  # nothing made (cancelled, failed): no cost to learn from
        rtf = run_s / audio_s
        weight = min(1.0, audio_s / self._config.short_audio_s)
        with self._lock:
            if predicted_s > 0 and math.isfinite(predicted_s):
                window = self._overruns.setdefault(backend, deque(maxlen=self._config.overrun_window))
                window.append(run_s / predicted_s)
            old = self._rtf.get(backend)
            a = (self.alpha_up if old is not None and rtf > old else self.alpha) * weight
            self._rtf[backend] = rtf if old is None else old + a * (rtf - old)
            for name in self._rtf:
                share = self._share.get(name, 0.0)
                self._share[name] = share + self.alpha * ((audio_s if name == backend else 0.0) - share)
            # A long job is believed at once, a short one slowly: what an urgent job waits for is a worker
            # busy with a long one (the guard is judged from this), not the mean job.
            up = self.alpha_up if run_s > self._job_s else self.alpha
            self._job_s = run_s if self._job_s == 0.0 else self._job_s + up * (run_s - self._job_s)

    def rtf(self) -> float:
        """The real-time factor of the current mix of backends (the prior before any job)."""
        with self._lock:
            if not self._rtf:
                return self.prior_rtf
            total = sum(self._share.values())
            if total <= 0:
                return max(self._rtf.values())
            return sum(self._rtf[b] * self._share[b] for b in self._rtf) / total

    def backend_rtf(self, backend: str) -> float | None:
        with self._lock:
            return self._rtf.get(backend)

    def overrun(self, backend: str) -> float | None:
        """How much longer than predicted `backend`'s runs take: the `overrun_quantile` of run time over
        prediction among its latest `overrun_window` runs (None before `overrun_min_runs`). The RTF is a
        mean; a run's own cost is not. Under load on 2 cores (bench/results/overload_s13.md) Kokoro ran
        at 1.0× its prediction at the median and 1.35× at p90: a short piece is mostly per-run overhead,
        and two runs side by side share the cores that one alone had."""
        with self._lock:
            runs = self._overruns.get(backend)
            if runs is None or len(runs) < self._config.overrun_min_runs:
                return None
            ordered = sorted(runs)
        return ordered[min(len(ordered) - 1, int(self._config.overrun_quantile * len(ordered)))]

    def overruns(self, backend: str) -> tuple[float, ...]:
        """`backend`'s latest runs' run time over prediction, oldest first (what `overrun` is read from)."""
        with self._lock:
            return tuple(self._overruns.get(backend, ()))

    @property
    def job_s(self) -> float:
        """About how long a long job runs: an EWMA that follows rises at once (0 before any)."""
        return self._job_s

    def streams(self, workers: int) -> int:
        """How many speaking streams `workers` workers keep ahead of their listeners, at least 1."""
        return max(1, math.floor(self.budget(workers) / max(self.rtf(), 1e-6)))

    def budget(self, workers: int) -> float:
        """What `workers` workers promise listeners: worker-seconds per second, of which a stream of a
        backend costs that backend's RTF."""
        return workers * self.headroom
