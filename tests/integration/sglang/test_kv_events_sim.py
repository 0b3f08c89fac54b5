"""The simulator's KV events (`simulator/kv_events.py`) followed into the exact
cache view: the story the real SGLang passes (tests/sglang/test_kv_events.py)."""

from __future__ import annotations

import json

from fairgate.bench.common import free_port

from service.engines.kv_events import KvEventsFollower
from service.engines.simulator.kv_events import SimKvEventsPublisher
from tests.helpers import eventually
from tests.kv_events_story import KV_TOKENS, view_follows_stores_and_evictions
from tests.sglang_helpers import StartSim


async def test_sim_view_follows_stores_and_evictions(start_sim: StartSim) -> None:
    server = await start_sim(kv_capacity_tokens=KV_TOKENS)
    port = free_port()
    publisher = SimKvEventsPublisher(
        json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}"})
    )
    server.engine.core.observe_cache(publisher)
    follower = KvEventsFollower(f"tcp://127.0.0.1:{port}")
    follower.start()

    async def subscribed() -> bool:
        # PUB drops what it sends before the SUB has joined; a clear is harmless
        # on an empty cache and makes the view exact from where it joined.
        publisher.cleared()
        return follower.batches > 0

    try:
        await eventually(subscribed, timeout_s=10, what="the follower to join")
        await view_follows_stores_and_evictions(server.url, follower)
    finally:
        await follower.stop()
        publisher.close()


async def test_an_event_the_schema_cannot_read_sends_the_worker_to_the_index(
    start_sim: StartSim,
) -> None:
    server = await start_sim(kv_capacity_tokens=KV_TOKENS)
    port = free_port()
    publisher = SimKvEventsPublisher(
        json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}"})
    )
    server.engine.core.observe_cache(publisher)
    follower = KvEventsFollower(f"tcp://127.0.0.1:{port}")
    follower.start()

    async def subscribed() -> bool:
        publisher.cleared()
        return follower.batches > 0

    try:
        await eventually(subscribed, timeout_s=10, what="the follower to join")
        assert follower.exact
        seq = publisher._seq.to_bytes(8, "big")  # the next one: not a gap
        publisher._pub.send_multipart((b"", seq, b"\xc1 not msgpack"))

        async def stale() -> bool:
            return not follower.exact

        await eventually(stale, timeout_s=10, what="the follower to give up")
    finally:
        await follower.stop()
        publisher.close()
