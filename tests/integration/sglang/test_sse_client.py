"""The SGLang adapter's own HTTP/1.1 client for `/generate` streams
(service/engines/sse_client.py): keep-alive reuse, what ends a connection, the
limit on open connections, backpressure, framing, refusals and broken HTTP.

The peer is a raw asyncio TCP server in this process that answers each request
with exact bytes, so framing, keep-alive and closes are the test's choice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass, field

import pytest
import uvloop

from service.engines.protocol import EngineChunk, EngineError, EngineRequest
from service.engines.sglang_chunks import RequestRefused, UpstreamError
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine, WorkerDown
from service.engines.sse_client import PAUSE_BYTES
from service.engines.sse_pool import SsePool
from tests.helpers import eventually


def _event(ids: list[int], finish: bool = False) -> bytes:
    meta = {
        "finish_reason": {"type": "length"} if finish else None,
        "prompt_tokens": 3,
        "completion_tokens": len(ids),
    }
    body = {"text": "".join(f" t{i}" for i in ids), "output_ids": ids, "meta_info": meta}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


STREAM = _event([5]) + _event([5, 6]) + _event([5, 6, 7], finish=True) + b"data: [DONE]\n\n"


def chunked(body: bytes, keep_alive: bool = True) -> bytes:
    """A 200 SSE answer in chunked encoding, one chunk per event."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    if not keep_alive:
        head += b"Connection: close\r\n"
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    return head + b"\r\n" + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


# What the peer does with the n-th request on a connection (0-based): writes bytes,
# or closes the connection when it returns None.
Answer = Callable[[int], Awaitable[bytes | None]]


@dataclass
class Peer:
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0


StartPeer = Callable[[Answer], Awaitable[Peer]]


@asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[Peer]:
    """A peer on 127.0.0.1 until the block ends (its connections cut then)."""
    peer = Peer()
    handlers: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        task.add_done_callback(handlers.discard)
        peer.connections += 1
        peer.open_now += 1
        peer.most_open = max(peer.most_open, peer.open_now)
        try:
            for n in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                peer.requests.append(head + await reader.readexactly(length))
                out = await answer(n)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            peer.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    peer.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield peer
    finally:
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


@pytest.fixture
async def start_peer() -> AsyncIterator[StartPeer]:
    async with AsyncExitStack() as stack:

        async def start(answer: Answer) -> Peer:
            return await stack.enter_async_context(serving(answer))

        yield start


def _engine(url: str, **config: object) -> SglangHttpEngine:
    return SglangHttpEngine(SglangHttpConfig(url=url, retries=0, **config))  # type: ignore[arg-type]


async def _stream(engine: SglangHttpEngine, rid: str = "r") -> list[EngineChunk]:
    async with aclosing(engine.generate(EngineRequest(rid, [1, 2, 3], 8))) as stream:
        return [c async for c in stream]


async def test_one_connection_serves_requests_one_after_another(start_peer: StartPeer) -> None:
    async def answer(n: int) -> bytes:
        return chunked(STREAM)

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    for i in range(3):
        chunks = await _stream(engine, f"r{i}")
        assert [c.token_ids for c in chunks] == [[5, 6, 7]] and chunks[-1].finish is not None
        # The trailing [DONE] read off, the connection waits for the next request.
        await eventually(lambda: engine.streams.idle_connections == 1, what="connection idle")
    assert peer.connections == 1 and len(peer.requests) == 3
    head = peer.requests[0].split(b"\r\n\r\n")[0]
    assert head.startswith(b"POST /generate HTTP/1.1\r\n")
    assert b"content-type: application/json" in head.lower()
    await engine.aclose()
    assert engine.streams.open_connections == 0


async def test_a_connection_the_server_closes_is_not_reused(start_peer: StartPeer) -> None:
    async def answer(n: int) -> bytes:
        return chunked(STREAM, keep_alive=False)

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    for i in range(2):
        await _stream(engine, f"r{i}")
    await eventually(lambda: engine.streams.open_connections == 0, what="connections closed")
    assert peer.connections == 2
    await engine.aclose()


async def test_an_idle_connection_closed_as_it_is_reused_is_retried_fresh(
    start_peer: StartPeer,
) -> None:
    # The second request on a connection is met with a close (a server's idle
    # timeout racing the reuse): sent again on a new connection, not a failure.
    async def answer(n: int) -> bytes | None:
        return chunked(STREAM) if n == 0 else None

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    await _stream(engine, "r0")
    await eventually(lambda: engine.streams.idle_connections == 1, what="connection idle")
    chunks = await _stream(engine, "r1")
    assert chunks[-1].completion_tokens == 3
    assert peer.connections == 2 and len(peer.requests) == 3
    await engine.aclose()


async def test_the_connection_limit_holds_streams_back(start_peer: StartPeer) -> None:
    release = asyncio.Event()

    async def answer(n: int) -> bytes:
        await release.wait()
        return chunked(STREAM)

    peer = await start_peer(answer)
    engine = _engine(peer.url, max_connections=1)
    streams = [asyncio.create_task(_stream(engine, f"r{i}")) for i in range(3)]
    await eventually(lambda: len(peer.requests) == 1, what="the first request")
    release.set()
    results = await asyncio.gather(*streams)
    assert all(r[-1].completion_tokens == 3 for r in results)
    assert peer.most_open == 1 and peer.connections == 1
    await engine.aclose()


async def _lagging_reader(peer_url: str, events: list[bytes]) -> None:
    pool = SsePool(peer_url, connect_timeout_s=5)
    conn = await pool.post("/generate", b"{}", {})
    await eventually(lambda: conn.reading_paused, what="reading paused")
    assert conn.pending_bytes <= PAUSE_BYTES + 256 * 1024  # and the read that crossed it
    got: list[bytes] = []
    while payloads := await conn.payloads():
        got += payloads
    assert got == [e[6:-2] for e in events]
    pool.release(conn)
    assert pool.idle_connections == 1
    await pool.aclose()
    assert pool.open_connections == 0


def _many_events() -> list[bytes]:
    """4x the pause threshold of ~1 kB events."""
    return [b"data: " + b"%07d" % i + b"x" * 987 + b"\n\n" for i in range(4 * PAUSE_BYTES // 1000)]


async def test_a_lagging_reader_stops_reading_the_socket(start_peer: StartPeer) -> None:
    """The worker sends 4x the pause threshold at once; while nobody takes the
    events, reading pauses with at most about the threshold buffered, and the
    rest arrives complete and in order once they are taken."""
    events = _many_events()

    async def answer(n: int) -> bytes:
        return chunked(b"".join(events))

    peer = await start_peer(answer)
    await _lagging_reader(peer.url, events)


def test_keep_alive_and_backpressure_under_uvloop() -> None:
    """The server runs on uvloop when installed (service/event_loop.py), whose
    transports are not asyncio's classes."""
    events = _many_events()
    answered = 0

    async def answer(n: int) -> bytes:
        nonlocal answered
        answered += 1
        return chunked(STREAM if answered <= 2 else b"".join(events))

    async def scenario() -> None:
        async with serving(answer) as peer:
            engine = _engine(peer.url)
            for i in range(2):
                chunks = await _stream(engine, f"r{i}")
                assert chunks[-1].token_ids == [5, 6, 7]
                await eventually(lambda: engine.streams.idle_connections == 1, what="idle")
            assert peer.connections == 1
            await engine.aclose()
            await _lagging_reader(peer.url, events)

    uvloop.run(scenario())


@pytest.mark.parametrize("framing", ["content-length", "close-delimited"])
async def test_bodies_framed_without_chunks(start_peer: StartPeer, framing: str) -> None:
    async def answer(n: int) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if framing == "content-length":
            return head + b"Content-Length: %d\r\n\r\n" % len(STREAM) + STREAM
        return head + b"Connection: close\r\n\r\n" + STREAM  # the close ends the body

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    chunks = await _stream(engine)
    assert chunks[-1].completion_tokens == 3 and chunks[-1].token_ids == [5, 6, 7]
    await engine.aclose()


@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [(400, RequestRefused, False), (503, UpstreamError, True)],
)
async def test_a_refusal_names_the_status_and_body(
    start_peer: StartPeer, status: int, error: type[EngineError], retryable: bool
) -> None:
    async def answer(n: int) -> bytes:
        body = b'{"detail": "no such model"}'
        return b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    with pytest.raises(error, match=f"answered HTTP {status}: .*no such model") as err:
        await _stream(engine)
    assert err.value.retryable is retryable
    assert engine.streams.open_connections == 0
    await engine.aclose()


async def test_a_refusal_whose_body_never_ends_is_bounded_by_the_read_timeout(
    start_peer: StartPeer,
) -> None:
    async def answer(n: int) -> bytes:
        return b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"

    peer = await start_peer(answer)
    engine = _engine(peer.url, read_timeout_s=0.2)
    with pytest.raises(UpstreamError, match=r"answered HTTP 500: \(its body did not come\)") as err:
        await _stream(engine)
    assert err.value.retryable and engine.streams.open_connections == 0
    await engine.aclose()


async def test_malformed_http_is_a_lost_worker(start_peer: StartPeer) -> None:
    async def answer(n: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n"

    peer = await start_peer(answer)
    engine = _engine(peer.url)
    with pytest.raises(WorkerDown, match=r"connection lost after 0 tokens.*malformed HTTP") as err:
        await _stream(engine)
    assert err.value.retryable
    assert engine.streams.open_connections == 0
    await engine.aclose()


async def test_nothing_listening_is_a_retryable_worker_down() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    engine = _engine(f"http://127.0.0.1:{port}")
    with pytest.raises(WorkerDown, match="cannot reach SGLang") as err:
        await _stream(engine)
    assert err.value.retryable and engine.streams.open_connections == 0
    await engine.aclose()


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="expected http"):
        SsePool("unix:///tmp/sglang.sock", connect_timeout_s=1)
