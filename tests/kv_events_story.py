"""One story told to the real SGLang and to the simulator, both publishing KV
events: the follower's exact view of a prompt must agree with the
`cached_tokens` the server reports for it next (floored to fairgate's 16-token
blocks), also after filler traffic evicted it, where the approximate index,
which only saw what was sent, still claims it."""

from __future__ import annotations

import random

import aiohttp

from service.engines.kv_events import KvEventsFollower
from service.engines.prefix_index import BLOCK_TOKENS, PrefixIndex, chain
from tests.helpers import eventually
from tests.sglang.wire import call

# The server's KV pool in tokens (--max-total-tokens / kv_capacity_tokens): small,
# so the filler evicts.
KV_TOKENS = 2048


async def _send(s: aiohttp.ClientSession, url: str, ids: list[int]) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    answer = await call(s, "POST", url + "/generate", body=body)
    assert answer.status == 200, answer
    return int(answer.body["meta_info"]["cached_tokens"])


def _floor(tokens: int) -> int:
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS


async def view_follows_stores_and_evictions(url: str, follower: KvEventsFollower) -> None:
    rng = random.Random(33)

    def ids(n: int) -> list[int]:  # below the tiny model's 474 ids
        return [rng.randrange(10, 400) for _ in range(n)]

    index = PrefixIndex([KV_TOKENS])
    async with aiohttp.ClientSession() as s:
        prompt = ids(300)
        keys = chain(prompt)
        await _send(s, url, prompt)
        index.insert(0, keys)

        async def stored() -> bool:
            return follower.view.match(keys) > 0

        await eventually(stored, timeout_s=30, what="the prompt's blocks in the view")
        held = follower.view.match(keys)
        assert held == _floor(len(prompt))
        assert _floor(await _send(s, url, prompt)) == held

        # Filler three times the pool: the prompt's blocks are evicted.
        for _ in range(3 * KV_TOKENS // 400):
            await _send(s, url, ids(400))

        async def evicted() -> bool:
            return follower.view.match(keys) < held

        await eventually(evicted, timeout_s=30, what="the prompt's eviction in the view")
        assert follower.exact, "a gap in the events"
        view_now = follower.view.match(keys)
        # The approximate index saw only what was sent to it: the prompt, still held.
        assert index.match(0, keys) == held
        assert _floor(await _send(s, url, prompt)) == view_now
