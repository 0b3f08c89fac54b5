"""Talking to the real SGLang server directly (no fairgate), to check what fairgate did."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import Any

import aiohttp

from service.engines.protocol import EngineChunk, EngineRequest, SamplingOptions
from service.engines.sglang_http import SglangHttpEngine

GREEDY = SamplingOptions(temperature=0.0)


async def post_generate(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One non-streaming `/generate`: (HTTP status, parsed body)."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=120)) as r,
    ):
        return r.status, await r.json(content_type=None)


async def post_json(url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.text()


async def reference(url: str, prompt: str, max_new_tokens: int, **params: Any) -> dict[str, Any]:
    """SGLang's own non-streaming answer (greedy unless told), the oracle for streams."""
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0, **params}
    status, body = await post_generate(url, {"text": prompt, "sampling_params": sampling})
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def loads(url: str) -> dict[str, int]:
    """Running and waiting requests and used KV tokens from `/v1/loads`."""
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/loads") as r:
        body = await r.json()
    (rank,) = body["loads"]
    return {k: int(rank.get(k, 0)) for k in ("num_running_reqs", "num_waiting_reqs")}


async def assert_sglang_idle(*urls: str, timeout_s: float = 15.0) -> None:
    """SGLang itself holds no request (running or waiting): nothing leaked upstream."""
    for url in urls:
        deadline = time.monotonic() + timeout_s
        while (got := await loads(url)) != {"num_running_reqs": 0, "num_waiting_reqs": 0}:
            assert time.monotonic() < deadline, f"{url} still holds requests: {got}"
            await asyncio.sleep(0.1)


async def wait_running(url: str, n: int, timeout_s: float = 10.0) -> None:
    """Until `/v1/loads` shows n running requests: it is a snapshot the scheduler
    publishes as it steps, so it lags the stream by up to a step or two."""
    deadline = time.monotonic() + timeout_s
    while (got := await loads(url))["num_running_reqs"] != n:
        assert time.monotonic() < deadline, f"{url}: expected {n} running, got {got}"
        await asyncio.sleep(0.05)


async def collect(engine: SglangHttpEngine, req: EngineRequest) -> list[EngineChunk]:
    async with aclosing(engine.generate(req)) as stream:
        return [c async for c in stream]


def pick_stop(text: str) -> str:
    """A stop string that occurs in `text` (random weights: no word is certain)."""
    words = [w for w in text.split(" ") if w.isalpha() and len(w) > 1]
    if words:
        return words[len(words) // 2]
    clean = [c for c in text[len(text) // 2 :] if c.isalnum()]
    assert clean, f"no stop string candidate in {text!r}"
    return clean[0]


def joined(chunks: list[EngineChunk]) -> tuple[str, list[int]]:
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


__all__ = [
    "GREEDY",
    "assert_sglang_idle",
    "collect",
    "joined",
    "loads",
    "pick_stop",
    "post_generate",
    "post_json",
    "reference",
    "wait_running",
]
