"""What the scheduler knows about a request: its tenant, size and class."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scheduler import rules


class Priority(enum.IntEnum):
    """Latency class. Lower value is served first within a tenant."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """One request waiting for (or holding) admission to the engine.

    Identity semantics (eq=False): two objects are never the same request.
    """

    request_id: str
    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    priority: Priority = Priority.INTERACTIVE
    arrival_s: float = 0.0
    # Absolute monotonic deadline; None means none.
    deadline_s: float | None = None
    # The API key it came with ("" without one): whose spend it adds to.
    key_id: str = ""
    # Set by the dispatcher: arrival order, used to break ties.
    seq: int = field(default=0)
    # Set at admission under a fair policy: its tenant was light (`rules.light`),
    # so the engine prefills it first (`rules.engine_priority`); and whether it
    # went beyond the engine's room (Isolation.PREEMPT), so the engine retracts a
    # running request for it.
    light: bool = False
    lent: bool = False
    # The prompt's prefix keys (service/engines/prefix_index.py), when the engine
    # routes by locality: admission asks how much of the prompt a worker holds.
    prefix_keys: Sequence[int] = ()
    # Set at admission with locality: the prompt tokens the worker it would be
    # placed on was thought to hold (its KV at admission, locality's preference).
    cached_estimate: int = 0
    # Set with it where the pool may hold a prompt and place it later (the cold-start
    # hold): the longest prefix of the prompt any worker was thought to hold.
    held_anywhere: int = 0
    # Set with it: the engine (a worker of a pool) that estimate counted on, which
    # the pool then routes to while it has room (service/engines/placement.py).
    cached_on: int | None = None

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens this request may add at most: its prompt and output,
        less the prefix a worker already holds (`cached_estimate`: shared with the
        requests that use it, so counted once, by the one that brought it)."""
        return rules.kv_tokens(self.prompt_tokens - self.cached_estimate, self.max_tokens)

    @property
    def charged_cached(self) -> int:
        """The prompt tokens admission charges at the cached rate
        (`rules.admission_charge`): the most any worker holds, erring high where
        it is placed elsewhere, since the engine's report at the first token
        charges a shortfall (`rules.cached_shortfall`) but refunds no better hit."""
        return max(self.cached_estimate, self.held_anywhere)


# How many of a queued request's prompt tokens the worker an engine pool would
# place it on holds (one with room while any has; its prefix index): what
# locality-aware admission prefers and counts as not adding KV; it may set
# `held_anywhere` too (charged at the cached rate, `charged_cached`).
Locality = Callable[[QueuedRequest], int]
# How many requests admitted here an engine does not have yet (an engine pool's
# paced, held and laned prompts): RESERVE_SLOTS lends their slots.
Unsent = Callable[[], int]
