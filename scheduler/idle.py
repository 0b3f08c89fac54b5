"""Idle tenants, and when each became idle: the state callers can grow.

In open and `dev-header` modes any valid id a caller names becomes a tenant,
with queues, counters and quota records. A tenant the registry does not
configure is forgotten once it has been idle (nothing queued or in flight)
for `ttl_s`: both dispatchers sweep it every `ttl_s / 4` (`due`), and each
forgets what it holds if it still may (a bucket not yet full is kept until it
is; `QuotaLedger.forget`, `Step.forget`). Forgetting changes nothing a
returning tenant would see: its counter is lifted to the floor when it
returns (VTC), and a full bucket reads as an absent one.
"""

from __future__ import annotations

from collections.abc import Callable


class IdleTenants:
    def __init__(self, ttl_s: float, now_s: float) -> None:
        self.ttl_s = ttl_s
        self._since: dict[str, float] = {}
        self._next_sweep_s = now_s + ttl_s / 4

    def note(self, tenant_id: str, now_s: float) -> None:
        """`tenant_id` may have become idle now (the sweep checks it still is)."""
        self._since[tenant_id] = now_s

    def due(self, now_s: float) -> list[str]:
        """At most every `ttl_s / 4`: the tenants noted at least `ttl_s` ago."""
        if now_s < self._next_sweep_s:
            return []
        self._next_sweep_s = now_s + self.ttl_s / 4
        return [t for t, since_s in self._since.items() if now_s - since_s >= self.ttl_s]

    def sweep(
        self, now_s: float, keep: Callable[[str], bool], forget: Callable[[str], bool]
    ) -> int:
        """Forget the tenants due (`due`): one that `keep` says stays (configured:
        its state is bounded by its config; busy: noted again when it next ends)
        is no longer watched; `forget` drops what is kept of one, False while it
        cannot go yet (a bucket not full: it is tried at the next sweep).
        Returns how many were forgotten."""
        forgotten = 0
        for tenant_id in self.due(now_s):
            if keep(tenant_id):
                self.drop(tenant_id)
            elif forget(tenant_id):
                self.drop(tenant_id)
                forgotten += 1
        return forgotten

    def drop(self, tenant_id: str) -> None:
        """Forgotten, configured, or busy again (noted anew when it next ends)."""
        self._since.pop(tenant_id, None)

    def __len__(self) -> int:
        return len(self._since)
