"""The other replicas' load on each worker, as the prefix share carries it.

Each replica's placement counts the requests and KV it has in flight on each
worker; with replicas, routing that weighs only its own treats a worker another
replica filled as free. Replicas announce their counts per worker when they
change (`Placement.on_load`, `prefix_share.py`), and again every second, so
that an entry not heard for `ttl_s` (its replica died, or Redis failed) stops
counting. With them goes the replica's *quiet* prefill there: the uncached
prompt tokens of its requests not announced one by one (`Placement._announce`:
shorter than `SHARED_PREFILL_MIN_TOKENS`) that have not streamed yet. On the
prefix mix most prompts are such short ones; a replica pacing only its own let
the other's pile onto the worker a light request went to (traced live, two
replicas, docs/benchmarks.md, session 29). Sent only with staggered prefill on
(`Placement.quiet_prefill`).
"""

from __future__ import annotations

from collections.abc import ValuesView

# Replicas repeat their loads every second: a few missed rounds keep an entry,
# and a replica that died stops weighing on the workers soon after.
REMOTE_LOAD_TTL_S = 5.0


class RemoteLoads:
    """Per worker: replica -> (requests, KV tokens, quiet prefill tokens, counted until)."""

    def __init__(self, workers: int, ttl_s: float = REMOTE_LOAD_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.by_worker: list[dict[str, tuple[int, int, int, float]]] = [{} for _ in range(workers)]

    def learn(
        self, i: int, replica: str, requests: int, kv_tokens: int, prefill: int, now_s: float
    ) -> None:
        """Replica `replica` has `requests` of `kv_tokens` in flight on worker `i`,
        `prefill` uncached prompt tokens of them not announced and not streamed."""
        self.by_worker[i][replica] = (
            max(0, requests),
            max(0, kv_tokens),
            max(0, prefill),
            now_s + self.ttl_s,
        )

    def of(self, i: int, now_s: float) -> tuple[int, int]:
        """The other replicas' requests and KV tokens in flight on worker `i`."""
        live = self._live(i, now_s)
        return sum(e[0] for e in live), sum(e[1] for e in live)

    def prefill(self, i: int, now_s: float) -> int:
        """The other replicas' quiet prefill on worker `i`."""
        return sum(e[2] for e in self._live(i, now_s))

    def _live(self, i: int, now_s: float) -> ValuesView[tuple[int, int, int, float]]:
        """Worker `i`'s entries still counted (the expired ones dropped)."""
        remote = self.by_worker[i]
        for rid in [rid for rid, e in remote.items() if e[3] <= now_s]:
            del remote[rid]
        return remote.values()
