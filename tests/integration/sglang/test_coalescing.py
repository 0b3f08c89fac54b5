"""The SGLang HTTP adapter's bulk SSE path: the events of one read become one
chunk, nothing is lost or reordered, errors still surface after the tokens
before them, and coalescing changes no result (only the number of messages).

The parser tests use an aiohttp peer that writes exact bytes in one write
(several events, CRLF, comments, a multi-line event), so one read holds them all.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import pytest
from aiohttp import web
from fairgate import AsyncClient

from service.engines.protocol import EngineChunk, EngineError, EngineRequest, FinishKind
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.settings import Settings
from tests.conftest import StartServer
from tests.sglang_helpers import StartSim, sglang_settings

Peer = Callable[[bytes], Awaitable[str]]


def _event(
    text: str, ids: list[int], finish: str | None = None, crlf: bool = False, done: int = 0
) -> bytes:
    """One SSE event; `done`: completion_tokens when not len(ids) (incremental)."""
    meta = {
        "id": "r",
        "finish_reason": None if finish is None else {"type": finish},
        "prompt_tokens": 3,
        "completion_tokens": done or len(ids),
        "cached_tokens": 0,
    }
    line = b"data: " + json.dumps({"text": text, "output_ids": ids, "meta_info": meta}).encode()
    return line + (b"\r\n\r\n" if crlf else b"\n\n")


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    """Start a server whose /generate answers `body` in a single write."""
    runners: list[web.AppRunner] = []

    async def start(body: bytes) -> str:
        async def generate(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(body)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for r in runners:
        await r.cleanup()


async def _collect(url: str, **config: Any) -> tuple[list[EngineChunk], EngineError | None]:
    engine = SglangHttpEngine(SglangHttpConfig(url=url, retries=0, **config))
    chunks: list[EngineChunk] = []
    error: EngineError | None = None
    try:
        req = EngineRequest("req-1", [1, 2, 3], max_tokens=3)
        async with aclosing(engine.generate(req)) as stream:
            async for chunk in stream:
                chunks.append(chunk)
    except EngineError as exc:
        error = exc
    finally:
        await engine.aclose()
    return chunks, error


CUMULATIVE = (
    _event("a", [5])
    + b": a comment line\n\n"
    + _event("ab", [5, 6], crlf=True)
    + _event("abc", [5, 6, 7], finish="length")
    + b"data: [DONE]\n\n"
)


async def test_one_read_of_cumulative_events_is_one_chunk(peer: Peer) -> None:
    url = await peer(CUMULATIVE)
    chunks, error = await _collect(url)
    assert error is None
    assert len(chunks) == 1
    (c,) = chunks
    assert (c.text, c.token_ids, c.completion_tokens) == ("abc", [5, 6, 7], 3)
    assert c.finish is FinishKind.LENGTH


async def test_without_coalescing_each_event_is_a_chunk(peer: Peer) -> None:
    url = await peer(CUMULATIVE)
    chunks, error = await _collect(url, coalesce=False)
    assert error is None
    assert [(c.text, c.token_ids) for c in chunks] == [("a", [5]), ("b", [6]), ("c", [7])]
    assert chunks[-1].finish is FinishKind.LENGTH


async def test_incremental_events_are_merged_in_order(peer: Peer) -> None:
    body = (
        _event("a", [5])
        # A multi-line event: its data lines are joined with newlines.
        + b'data: {"text": "b", "output_ids": [6],\ndata:  "meta_info": {"finish_reason": null,'
        b' "prompt_tokens": 3, "completion_tokens": 2}}\n\n'
        + _event("c", [7], finish="length", done=3)
        + b"data: [DONE]\n\n"
    )
    url = await peer(body)
    chunks, error = await _collect(url, incremental_output=True)
    assert error is None
    assert [(c.text, c.token_ids, c.completion_tokens) for c in chunks] == [("abc", [5, 6, 7], 3)]


async def test_broken_event_fails_after_the_tokens_before_it(peer: Peer) -> None:
    body = _event("a", [5]) + _event("ab", [5, 6]) + b'data: {"text": "oops", "meta_in\n\n'
    url = await peer(body)
    chunks, error = await _collect(url)
    assert [(c.text, c.token_ids) for c in chunks] == [("ab", [5, 6])]
    assert error is not None and "malformed JSON" in str(error)
    assert not error.retryable  # tokens reached the consumer


async def test_an_error_object_is_never_skipped_as_superseded(peer: Peer) -> None:
    error_event = b'data: {"error": {"message": "bad input", "code": 400}}\n\n'
    url = await peer(error_event + _event("a", [5], finish="length") + b"data: [DONE]\n\n")
    chunks, error = await _collect(url)
    assert chunks == []
    assert error is not None and "bad input" in str(error)


@pytest.mark.parametrize(
    "overrides",
    [{"stream_coalesce": False}, {"stream_coalesce_window_ms": 5.0}],
    ids=["one-per-event", "window-5ms"],
)
async def test_coalescing_changes_no_result(
    start_server: StartServer, start_sim: StartSim, overrides: dict[str, Any]
) -> None:
    stand_in = await start_sim()
    coalesced = await start_server(**sglang_settings(stand_in))
    other = await start_server(**sglang_settings(stand_in, **overrides))
    opts: dict[str, Any] = dict(max_tokens=60, seed=5, stop=["ab"], return_token_ids=True)
    async with AsyncClient(coalesced.address) as a, AsyncClient(other.address) as b:
        for prompt in ("fair queueing is", "tokens and more tokens"):
            # Each from a cold prefix cache, so that cached_tokens compare too.
            assert stand_in.engine.core.flush_cache()
            got = await a.complete(prompt, **opts)
            assert stand_in.engine.core.flush_cache()
            want = await b.complete(prompt, **opts)
            assert (got.text, got.token_ids) == (want.text, want.token_ids)
            assert got.result.usage == want.result.usage
            assert got.result.finish_reason == want.result.finish_reason
            assert len(got.token_ids) == got.result.usage.completion_tokens


def test_the_window_setting_is_bounded() -> None:
    with pytest.raises(
        ValueError, match=r"FAIRGATE_STREAM_COALESCE_WINDOW_MS\): expected a number in \[0, 1000\]"
    ):
        Settings.from_env({}, stream_coalesce_window_ms=-1.0)
    assert Settings.from_env({}, stream_coalesce_window_ms=2.5).stream_coalesce_window_ms == 2.5
