"""Wall-clock timers per phase. The harness times; workloads never time themselves."""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field


def now_ms() -> float:
    return time.time() * 1000.0


@dataclass
class PhaseTimer:
    """Accumulates seconds and counts per named phase: ``with timer("step"): ...``."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] += time.perf_counter() - t0
            self.counts[phase] += 1

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] += seconds
        self.counts[phase] += 1

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            k: {"seconds": round(v, 6), "count": self.counts[k], "mean_s": round(v / max(1, self.counts[k]), 6)}
            for k, v in self.totals.items()
        }

    def reset(self) -> None:
        self.totals.clear()
        self.counts.clear()
