"""The exact cache view (`kv_events.py`) against the real SGLang's KV events.

The server publishes on ZMQ (`--kv-events-config`) with a small KV pool, so filler
traffic evicts. After each request the follower's view of a prompt must agree
with the `cached_tokens` SGLang reports for it next (floored to fairgate's
16-token blocks), including after the prompt was evicted, where the approximate
index, which only saw what was sent, still claims it.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio
from fairgate.bench.common import free_port
from fairgate.bench.sglang_cpu import RealSglang, SglangUnavailable, install

from service.engines.kv_events import KvEventsFollower
from service.engines.prefix_index import BLOCK_TOKENS, PrefixIndex, chain
from tests.helpers import eventually
from tests.sglang.wire import call

KV_TOKENS = 2048


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


@pytest_asyncio.fixture
async def follower(
    sglang_events: tuple[RealSglang, str, str],
) -> AsyncIterator[KvEventsFollower]:
    _, pub, replay = sglang_events
    f = KvEventsFollower(pub, replay_endpoint=replay)
    f.start()
    try:
        yield f
    finally:
        await f.stop()


async def _send(s: aiohttp.ClientSession, url: str, ids: list[int]) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    answer = await call(s, "POST", url + "/generate", body=body)
    assert answer.status == 200, answer
    return int(answer.body["meta_info"]["cached_tokens"])


def _floor(tokens: int) -> int:
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS


async def test_view_follows_stores_and_evictions(
    sglang_events: tuple[RealSglang, str, str], follower: KvEventsFollower
) -> None:
    server = sglang_events[0]
    rng = random.Random(33)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 400) for _ in range(n)]

    index = PrefixIndex([KV_TOKENS])
    async with aiohttp.ClientSession() as s:
        prompt = ids(300)
        keys = chain(prompt)
        await _send(s, server.url, prompt)
        index.insert(0, keys)

        async def stored() -> bool:
            return follower.view.match(keys) > 0

        await eventually(stored, timeout_s=30, what="the prompt's blocks in the view")
        held = follower.view.match(keys)
        assert held == _floor(len(prompt))
        assert _floor(await _send(s, server.url, prompt)) == held

        # Filler larger than the pool: the prompt's blocks are evicted.
        for _ in range(3 * KV_TOKENS // 400):
            await _send(s, server.url, ids(400))

        async def evicted() -> bool:
            return follower.view.match(keys) < held

        await eventually(evicted, timeout_s=30, what="the prompt's eviction in the view")
        assert follower.exact, "a gap in the events"
        view_now = follower.view.match(keys)
        # The approximate index saw only what was sent to it: the prompt, still held.
        assert index.match(0, keys) == held
        assert _floor(await _send(s, server.url, prompt)) == view_now
