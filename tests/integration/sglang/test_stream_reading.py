"""How the SGLang HTTP adapter reads a stream: the read timeout (a watchdog on the
byte counter, service/engines/read_watchdog.py) and the coalescing window (the
socket is not read while it lasts).

The peer is an aiohttp server in this process whose `/generate` is driven step
by step by the test, so what it sends and when is exact.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from service.engines.protocol import EngineChunk, EngineRequest
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine, WorkerDown


def _event(ids: list[int], finish: bool = False) -> bytes:
    meta = {
        "id": "r",
        "finish_reason": {"type": "length"} if finish else None,
        "prompt_tokens": 3,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
    }
    text = "".join(f" t{i}" for i in ids)
    body = {"text": text, "output_ids": ids, "meta_info": meta}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass
class Script:
    """What the peer does: before the headers, wait for `headers`; then send each
    item of `sends` (bytes) after waiting for the event before it, if any."""

    headers: asyncio.Event = field(default_factory=asyncio.Event)
    sends: list[bytes | asyncio.Event] = field(default_factory=list)
    requests: int = 0


Peer = Callable[[Script], Awaitable[str]]


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    runners: list[web.AppRunner] = []

    async def start(script: Script) -> str:
        async def generate(request: web.Request) -> web.StreamResponse:
            script.requests += 1
            await script.headers.wait()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for item in script.sends:
                if isinstance(item, asyncio.Event):
                    await item.wait()
                else:
                    await resp.write(item)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_post("/abort_request", _ok)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for r in runners:
        await r.cleanup()


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})


def _engine(url: str, **config: Any) -> SglangHttpEngine:
    return SglangHttpEngine(SglangHttpConfig(url=url, retries=0, coalesce=False, **config))


async def _consume(
    engine: SglangHttpEngine, on_chunk: Callable[[EngineChunk], Awaitable[None]] | None = None
) -> list[EngineChunk]:
    chunks: list[EngineChunk] = []
    try:
        async with aclosing(engine.generate(EngineRequest("req-1", [1, 2, 3], 8))) as stream:
            async for chunk in stream:
                chunks.append(chunk)
                if on_chunk is not None:
                    await on_chunk(chunk)
    finally:
        await engine.aclose()
    return chunks


async def test_a_silent_worker_fails_the_stream_after_the_tokens_it_sent(peer: Peer) -> None:
    never = asyncio.Event()
    script = Script(sends=[_event([5]), _event([5, 6]), never])
    script.headers.set()
    engine = _engine(await peer(script), read_timeout_s=0.2)
    chunks: list[EngineChunk] = []

    async def keep(chunk: EngineChunk) -> None:
        chunks.append(chunk)

    with pytest.raises(WorkerDown, match=r"no data for 0\.2 s after 2 tokens") as err:
        await _consume(engine, keep)
    assert [c.token_ids for c in chunks] == [[5], [6]]
    assert not err.value.retryable  # tokens reached the consumer


async def test_a_worker_that_never_answers_is_retryable(peer: Peer) -> None:
    script = Script()  # the headers never come
    engine = _engine(await peer(script), read_timeout_s=0.2)
    with pytest.raises(WorkerDown, match=r"no data for 0\.2 s \(no headers\)") as err:
        await _consume(engine)
    assert err.value.retryable and script.requests == 1


async def test_a_slow_consumer_is_not_the_workers_silence(peer: Peer) -> None:
    """The consumer holds the stream for 3 read timeouts while the worker, which
    has nothing more to send meanwhile, is silent: not a timeout (aiohttp's
    sock_read would have failed it)."""
    rest = asyncio.Event()
    script = Script(sends=[_event([5]), rest, _event([5, 6]), _event([5, 6, 7], finish=True)])
    script.headers.set()
    engine = _engine(await peer(script), read_timeout_s=0.2)

    async def slow(chunk: EngineChunk) -> None:
        if chunk.token_ids == [5]:
            await asyncio.sleep(0.6)
            rest.set()

    chunks = await _consume(engine, slow)
    assert [c.token_ids for c in chunks] == [[5], [6], [7]]
    assert chunks[-1].finish is not None


async def test_the_window_gathers_what_arrives_meanwhile_into_one_chunk(peer: Peer) -> None:
    """After the first token the adapter stops reading for the window; the three
    events the worker sends meanwhile come out as one chunk, nothing lost. The
    window outlasts the read timeout: a pause of our own is not the worker's silence."""
    more = asyncio.Event()
    script = Script(
        sends=[
            _event([5]),
            more,
            _event([5, 6]),
            _event([5, 6, 7]),
            _event([5, 6, 7, 8], finish=True),
            b"data: [DONE]\n\n",
        ]
    )
    script.headers.set()
    engine = SglangHttpEngine(
        SglangHttpConfig(
            url=await peer(script), retries=0, coalesce_window_s=1.0, read_timeout_s=0.3
        )
    )

    async def first(chunk: EngineChunk) -> None:
        more.set()  # the worker sends the rest while the window holds

    chunks = await _consume(engine, first)
    assert [c.token_ids for c in chunks] == [[5], [6, 7, 8]]  # the first token is not held
    assert [c.text for c in chunks] == [" t5", " t6 t7 t8"]
    assert chunks[-1].completion_tokens == 4 and chunks[-1].finish is not None
