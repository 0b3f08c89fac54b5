"""The fairness bound's oracle: the largest spread of weighted service between
two tenants over any interval where both were backlogged."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class FairnessMonitor:
    """Largest spread of W_f/w_f - W_g/w_g over intervals where both are backlogged."""

    weights: dict[str, float]
    service: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    worst: float = 0.0
    _ranges: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # Service at the last moment at least `full_size` tenants were backlogged (0: off).
    full_size: int = 0
    service_while_full: dict[str, float] = field(default_factory=dict)

    def update(self, backlogged: set[str]) -> None:
        if self.full_size and len(backlogged) >= self.full_size:
            self.service_while_full = dict(self.service)
        live = sorted(backlogged)
        keep: dict[tuple[str, str], tuple[float, float]] = {}
        for i, f in enumerate(live):
            for g in live[i + 1 :]:
                d = self.service[f] / self.weights[f] - self.service[g] / self.weights[g]
                lo, hi = self._ranges.get((f, g), (d, d))
                lo, hi = min(lo, d), max(hi, d)
                keep[(f, g)] = (lo, hi)
                self.worst = max(self.worst, hi - lo)
        self._ranges = keep
