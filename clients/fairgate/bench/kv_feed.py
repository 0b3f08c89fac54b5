"""Issue #33's lever 3 on the virtual fleet: each simulated engine's KV events
into the exact cache view the placement reads (`Placement.exact`), by the live
path with the socket left out. The simulator frames each store and eviction as
SGLang publishes it (`SimKvEvents`: msgpack batches, numbered), and the
follower that reads them live applies them (`KvEventsFollower.apply`).

A batch reaches the view when the engine step that made it ends, as SGLang
publishes after its scheduler's iteration (live, ZMQ's transit comes on top);
the simulator computes a step's stores and evictions when the step starts.
"""

from __future__ import annotations

from service.engines.kv_events import KvEventsFollower
from service.engines.kv_view import CacheView
from service.engines.simulator.core import SimCore
from service.engines.simulator.kv_events import Frames, SimKvEvents


class KvFeed:
    """One engine's events, held until `deliver` (its step ended)."""

    def __init__(self, core: SimCore, name: str) -> None:
        self.follower = KvEventsFollower(name)  # never started: no socket
        self._batches: list[tuple[int, bytes]] = []
        core.observe_cache(SimKvEvents(self._published))

    @property
    def view(self) -> CacheView:
        return self.follower.view

    def _published(self, frames: Frames) -> None:
        _topic, seq, payload = frames
        self._batches.append((int.from_bytes(seq, "big", signed=True), payload))

    def deliver(self) -> None:
        for seq, payload in self._batches:
            self.follower.apply(seq, payload)
        self._batches.clear()
