"""The tenants' token buckets as the shared store keeps them, in memory.

Keyed (tenant, "r" | "t") like the Redis STEP script's keys, each a
`StoredLevel` (token_bucket.py: a level and when it was set; the one bucket
model). An absent bucket is a full one: a bucket is written only by an add,
and a forgotten tenant's bucket goes once full (`forget`). Used by
`MemoryStore` for the fleet's buckets (the Lua's twin).
"""

from __future__ import annotations

from scheduler import rules
from scheduler.quotas import BucketLimits
from scheduler.rules import bucket_wait_s
from scheduler.state.store import SeenLevel
from scheduler.token_bucket import StoredLevel

# (tenant, "r" | "t") -> its level and when it was set
BucketKey = tuple[str, str]


class StoredBuckets:
    __slots__ = ("levels",)

    def __init__(self) -> None:
        self.levels: dict[BucketKey, StoredLevel] = {}

    def level(self, tenant: str, kind: str, rate: float, burst: float, now_s: float) -> float:
        b = self.levels.get((tenant, kind))
        return burst if b is None else b.at(now_s, rate, burst)

    def seen(self, tenant: str, now_s: float) -> dict[str, SeenLevel]:
        """Its stored levels by kind and their ages (a full bucket is absent)."""
        return {
            kind: SeenLevel(b.level, max(0.0, now_s - b.updated_s))
            for kind in ("r", "t")
            if (b := self.levels.get((tenant, kind))) is not None
        }

    def wait(self, tenant: str, tokens: int, lim: BucketLimits, now_s: float) -> tuple[str, float]:
        """Which bucket binds taking 1 request and `tokens`, and for how long
        (`rules.binding_limit`)."""
        rw = tw = None
        if lim.requests_per_s is not None and lim.requests_burst is not None:
            lvl = self.level(tenant, "r", lim.requests_per_s, lim.requests_burst, now_s)
            rw = bucket_wait_s(lvl, 1.0, lim.requests_per_s, lim.requests_burst)
        if lim.tokens_per_s is not None and lim.tokens_burst is not None:
            lvl = self.level(tenant, "t", lim.tokens_per_s, lim.tokens_burst, now_s)
            tw = bucket_wait_s(lvl, float(tokens), lim.tokens_per_s, lim.tokens_burst)
        return rules.binding_limit(rw, tw)

    def add(self, tenant: str, req: float, tok: float, lim: BucketLimits, now_s: float) -> None:
        """Add to the buckets (negative: take, debt allowed; never above the burst)."""
        if req and lim.requests_per_s is not None and lim.requests_burst is not None:
            self._add_to(tenant, "r", req, lim.requests_per_s, lim.requests_burst, now_s)
        if tok and lim.tokens_per_s is not None and lim.tokens_burst is not None:
            self._add_to(tenant, "t", tok, lim.tokens_per_s, lim.tokens_burst, now_s)

    def _add_to(
        self, tenant: str, kind: str, n: float, rate: float, burst: float, now_s: float
    ) -> None:
        b = self.levels.get((tenant, kind))
        if b is None:  # absent: full
            b = self.levels[(tenant, kind)] = StoredLevel(burst, now_s)
        b.add(n, now_s, rate, burst)

    def forget(self, tenant: str, lim: BucketLimits, now_s: float) -> None:
        """A tenant idle fleet-wide: its full buckets (or no longer limited ones) go
        now, the others once full (the wait for a whole burst)."""
        for kind, rate, burst in (
            ("r", lim.requests_per_s, lim.requests_burst),
            ("t", lim.tokens_per_s, lim.tokens_burst),
        ):
            b = self.levels.get((tenant, kind))
            if b is None:
                continue
            left_s = 0.0
            if rate is not None and burst is not None:
                left_s = rules.refill_s(self.level(tenant, kind, rate, burst, now_s), rate, burst)
            if left_s > 0:
                b.expires_s = now_s + left_s
            else:
                del self.levels[(tenant, kind)]

    def expire(self, now_s: float) -> None:
        for key in [k for k, b in self.levels.items() if b.expires_s <= now_s]:
            del self.levels[key]

    def seed(self, levels: dict[BucketKey, float], now_s: float) -> None:
        for key, level in levels.items():
            self.levels[key] = StoredLevel(level, now_s)

    def snapshot(
        self, now_s: float
    ) -> tuple[
        dict[str, tuple[float | None, float | None]], dict[str, tuple[float | None, float | None]]
    ]:
        """Each tenant's (requests, tokens) levels and their ages (`StoreSnapshot`)."""
        levels: dict[str, tuple[float | None, float | None]] = {}
        ages: dict[str, tuple[float | None, float | None]] = {}
        for (tenant, kind), b in self.levels.items():
            r, t = levels.get(tenant, (None, None))
            levels[tenant] = (b.level, t) if kind == "r" else (r, b.level)
            ra, ta = ages.get(tenant, (None, None))
            age_s = now_s - b.updated_s
            ages[tenant] = (age_s, ta) if kind == "r" else (ra, age_s)
        return levels, ages
