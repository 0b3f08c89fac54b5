"""The exact cache view (`kv_events.py`) against the real SGLang's KV events
(`--kv-events-config`, with a replay socket), on a small KV pool; the same story
against the simulator is tests/integration/sglang/test_kv_events_sim.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fairgate.bench.common import free_port
from fairgate.bench.sglang_cpu import RealSglang, SglangUnavailable, install

from service.engines.kv_events import KvEventsFollower
from tests.kv_events_story import KV_TOKENS, view_follows_stores_and_evictions


@pytest.fixture(scope="module")
def sglang_events() -> Iterator[tuple[RealSglang, str, str]]:
    pub, replay = free_port(), free_port()
    config = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    try:
        install()
        server = RealSglang.start(
            "--kv-events-config", json.dumps(config), "--max-total-tokens", str(KV_TOKENS)
        )
    except SglangUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
    finally:
        server.stop()


async def test_view_follows_stores_and_evictions(
    sglang_events: tuple[RealSglang, str, str],
) -> None:
    server, pub, replay = sglang_events
    follower = KvEventsFollower(pub, replay_endpoint=replay)
    follower.start()
    try:
        await view_follows_stores_and_evictions(server.url, follower)
    finally:
        await follower.stop()
