"""Which worker of a pool a request goes to: the rule, without I/O.

`least_full`: the worker that would be least full with the request (the busier
of its slots and its KV, over its own capacity); with prefix affinity, the
worker the prompt's first tokens hash to (`preferred`) while it is within
`slack` of the least full.

`locality`: the worker where the request would get its first token soonest.
That is the prefill work ahead of it there (the uncached prompt tokens of the
requests routed there that have not streamed yet: queued plus in progress)
plus its own uncached prompt on that worker (its prompt minus the prefix the
worker is thought to hold, `prefix_index.py`), plus `balance_tokens` times how
full the worker is, so that a cached prefix does not pile every request onto
one worker while the others idle. Only workers with room are considered while
any has room. So a conversation's next turn goes where its history is, a
tenant's system prompt stays warm on the workers it was sent to, and a short
request goes to a worker that is not in the middle of another tenant's long
prefill. A light tenant's request (`soonest`) drops the balance term: where it
starts soonest, whatever the load (isolation across engines: on a worker that is
only decoding, its first token waits for one decode step, not a prefill chunk).
Where its engine retracts a running request for it (SGLang's priority
preemption; the pool then sends it with a lent request's priority,
`Placement.priority_on`), a full worker counts as having room: a slot is freed for
it at the next step, where a worker with a free slot may have a prefill ahead.

Ties go to the least full worker, then to the first.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Routing = Literal["least_full", "locality"]
ROUTINGS: tuple[Routing, ...] = ("least_full", "locality")

# A worker at full load weighs as this many prefill tokens ahead (locality).
# On the virtual fleet's prefix mix, 2048 kept cached prefixes off busy workers
# (0.64 of prompts from cache, against 0.70 with 512 and 0.72 with none); none at
# all would pile a hot prefix onto one worker until it is full.
BALANCE_TOKENS = 512


def fullness(
    in_flight: int, kv_in_flight: int, slots: int, kv_capacity: int, requests: int, kv_tokens: int
) -> float:
    """How full a worker would be with `requests` more of `kv_tokens` in all, as a
    fraction of its own capacity: the busier of its slots and its KV."""
    return max(
        (in_flight + requests) / max(1, slots), (kv_in_flight + kv_tokens) / max(1, kv_capacity)
    )


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as routing sees it, for one request."""

    # How full it would be with the request (1.0: its slots or KV are full).
    load: float
    # Uncached prompt tokens routed there that have not streamed yet.
    pending_prefill: int = 0
    # Tokens of the request's prompt the worker is thought to hold.
    matched: int = 0


def route(
    workers: Sequence[WorkerView],
    prompt_tokens: int,
    routing: Routing = "least_full",
    *,
    preferred: int | None = None,
    slack: float = 0.0,
    balance_tokens: float | None = None,
    soonest: bool = False,
    preempts: bool = False,
) -> int:
    """The index of the chosen worker in `workers` (not empty). `soonest` (a
    light tenant's request, locality): no balance term, the worker where it
    starts soonest whatever its load, so that a worker that is only decoding
    takes it before one in the middle of a prefill; with `preempts` (its engine
    retracts a running request for it) a full worker counts as having room."""
    balance = BALANCE_TOKENS if balance_tokens is None else balance_tokens
    if soonest:
        balance = 0.0
    if routing == "least_full":
        best = min(range(len(workers)), key=lambda i: (workers[i].load, i))
        if preferred is not None and workers[preferred].load <= workers[best].load + slack:
            return preferred
        return best
    everyone = list(range(len(workers)))
    room = everyone if soonest and preempts else [i for i in everyone if workers[i].load <= 1.0]
    room = room or everyone

    def cost(i: int) -> tuple[float, float, int]:
        w = workers[i]
        uncached = max(0, prompt_tokens - w.matched)
        return (w.pending_prefill + uncached + balance * w.load, w.load, i)

    return min(room, key=cost)


def affinity(prompt: Sequence[int], candidates: int, tokens: int) -> int | None:
    """Prefix affinity (`tokens` > 0): which of `candidates` workers the prompt's
    first `tokens` tokens hash to (`route`'s `preferred`); None: none."""
    if not tokens or len(prompt) < tokens:
        return None
    return zlib.crc32(repr(list(prompt[:tokens])).encode()) % candidates
