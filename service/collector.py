"""Python's cyclic garbage collector and the streams' latency.

A full collection walks every object the collector tracks, and every stream the
process serves waits meanwhile. Right after start that is every module, library
and configuration object (about 90 000 in a gateway): 40-50 ms a collection on
the 2-core development machine, 70-150 ms while it also runs engines and a load
generator, found nothing to free (a light tenant's first token waited for one).
Nothing built at start becomes garbage, so once started the server collects what
start left over and moves the rest out of the collector's sight (`gc.freeze`, as
SGLang's `freeze_gc` does after its warm-up): full collections then walk only what
came since.
"""

from __future__ import annotations

import gc


def freeze_startup() -> int:
    """Collect what start left over and freeze the rest; how many objects froze."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
