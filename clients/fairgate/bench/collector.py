"""The load generator's own garbage collections, kept off the times it records.

A bench client holds its whole plan (thousands of requests, their prompts) and a
record per request. A full collection walks all of it while the event loop
waits: up to 90 ms on the 2-core machine during a four-worker run, and a first
token arriving meanwhile is timed that much late, the gateway's fault on paper.
Frozen, the plan leaves the walks, but the records and streams of the run still
made collections of 15-60 ms. A replay makes next to no cyclic garbage (about
2 300 objects by the middle of a four-worker run), so the collector is off while
it runs and collects once after. The decision micro-benchmark times its loop the
same way.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_off() -> Iterator[None]:
    """No cyclic garbage collection in the block (as it was found: on or off)."""
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
        gc.collect()
