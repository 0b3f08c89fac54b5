"""What the placement (`placement.py`) works with and keeps: a worker as it
needs it (`Target`), one request's claim on one worker (`Placed`), and how
admission's locality choice fared (`LocalityStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Target(Protocol):
    """A worker as placement needs it."""

    @property
    def url(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    def slots(self) -> int:
        """Its running-request slots."""
        ...

    def kv_capacity(self) -> int:
        """Its KV-cache tokens."""
        ...

    def penalty(self, now_s: float) -> int:
        """Requests' worth of load it carries beyond those in flight (recent failures)."""
        ...


@dataclass(slots=True, eq=False)
class Placed:
    """One request on one worker, as the placement counted it there."""

    worker: int
    # The priority it goes to that worker with (`Placement.priority_on`).
    priority: int
    # Prompt tokens the worker is thought to hold, and the KV it added there
    # (`Placement.adds_kv`: less what other requests in flight pin).
    matched: int
    kv_tokens: int
    # Its uncached prompt tokens not streamed yet (0 after the first token).
    pending: int
    keys: list[int] = field(default_factory=list)
    released: bool = False
    # Its prompt counts as held on the worker while it is being computed (`held`).
    computing: bool = False
    # Of `matched`, the prefix a request placed there before it was still
    # computing: the engine may not hold it yet, so a miss of it is no eviction.
    matched_computing: int = 0
    # Its prefill as announced to the other replicas (`Placement.on_prefill`); "": not.
    prefill_id: str = ""
    # Its KV beyond its keys' blocks (which count while any request pins them).
    own_kv: int = 0
    # Its place in the order the placement placed requests in.
    seq: int = 0
    # A light tenant's request that has not streamed yet (`Placement.sheltered`).
    light_waiting: bool = False
    # When it was placed (the placement's clock).
    placed_s: float = 0.0


@dataclass(slots=True)
class LocalityStats:
    """How admission's locality choice fared at placement."""

    # Requests admission counted a cached prefix on a worker for.
    hinted: int = 0
    # Placed on that worker.
    followed: int = 0
    # Placed elsewhere: the worker was unhealthy (or already tried), or full.
    unavailable: int = 0
    full: int = 0
    # Not followed by choice: a light request placed where it starts sooner (its
    # prefix weighed there) than on admission's worker (`Placement._follow`).
    sooner: int = 0
    # Of the followed: the rule alone would have picked another worker.
    overrode: int = 0
    # Prompt tokens admission counted as cached that the worker used does not hold
    # (per request at most its `cached_estimate`; charged back at the first token,
    # `rules.cached_shortfall`).
    missed_tokens: int = 0

    @property
    def mismatched(self) -> int:
        return self.unavailable + self.full
