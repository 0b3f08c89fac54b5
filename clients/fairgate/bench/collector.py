"""The load generator's own garbage collections, kept off the times it records.

A bench client holds its whole plan (thousands of requests, their prompts) and a
record per request. A full collection walks all of it while the event loop
waits: up to 90 ms on the 2-core machine during a four-worker run, and a first
token arriving meanwhile is timed that much late, the gateway's fault on paper.
The plan never becomes garbage, so a replay freezes it (`gc.freeze`, as the
server freezes what its start built): full collections walk only what the run
adds. Left frozen no longer than the replay.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def plan_frozen() -> Iterator[None]:
    """Collect, freeze what is left for the block, and unfreeze after it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
