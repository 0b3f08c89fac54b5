"""The other replicas' load on each worker, as the prefix share carries it.

Each replica's placement counts the requests and KV it has in flight on each
worker; with replicas, routing that weighs only its own treats a worker another
replica filled as free. Replicas announce their counts per worker when they
change (`Placement.on_load`, `prefix_share.py`), and again every second, so
that an entry not heard for `ttl_s` (its replica died, or Redis failed) stops
counting.
"""

from __future__ import annotations

# Replicas repeat their loads every second: a few missed rounds keep an entry,
# and a replica that died stops weighing on the workers soon after.
REMOTE_LOAD_TTL_S = 5.0


class RemoteLoads:
    """Per worker: replica -> (requests, KV tokens, counted until)."""

    def __init__(self, workers: int, ttl_s: float = REMOTE_LOAD_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.by_worker: list[dict[str, tuple[int, int, float]]] = [{} for _ in range(workers)]

    def learn(self, i: int, replica: str, requests: int, kv_tokens: int, now_s: float) -> None:
        """Replica `replica` has `requests` of `kv_tokens` in flight on worker `i`."""
        self.by_worker[i][replica] = (max(0, requests), max(0, kv_tokens), now_s + self.ttl_s)

    def of(self, i: int, now_s: float) -> tuple[int, int]:
        """The other replicas' requests and KV tokens in flight on worker `i`."""
        remote = self.by_worker[i]
        if not remote:
            return 0, 0
        for rid in [rid for rid, (_, _, until_s) in remote.items() if until_s <= now_s]:
            del remote[rid]
        return sum(n for n, _, _ in remote.values()), sum(kv for _, kv, _ in remote.values())
