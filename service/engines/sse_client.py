"""A minimal HTTP/1.1 client for one kind of call: a POST whose answer is an SSE stream.

The SGLang adapter's hot path (`POST /generate`, `stream: true`) spent about as
much CPU per token in aiohttp's reading machinery (the stream reader's feed and
wake-up per HTTP chunk, a resume per read) as in everything it does with the
token. Here an `asyncio.Protocol` feeds each socket read to httptools (llhttp,
the C parser uvicorn uses: status, headers, chunked transfer decoding) and
splits the body into SSE `data:` payloads in `data_received`; the reader takes
every payload received so far in one call (`SseConnection.payloads`).

- `SsePool` (`sse_pool.py`): keep-alive connections to one engine URL (LIFO
  idle list, an optional limit on open connections), reused only after a
  complete response whose server allows keep-alive; a reused connection that
  closes before any byte of the answer is retried once on a fresh one (the
  server's idle close).
- Backpressure: reading pauses while more than `PAUSE_BYTES` of payloads wait
  for the reader (the rest waits in the kernel), and while the reader holds the
  stream (`hold`, the coalescing window).
- Failures: `ConnectFailed` (no connection), `StreamLost` (the connection
  closed before the response ended, or the worker sent malformed HTTP), and
  whatever `fail` is given (the read watchdog's `ReadTimeout`). Payloads
  received before a failure are handed over first.

Everything else (health, abort, server info) stays on aiohttp: not per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

from service.engines.sglang_chunks import UpstreamError
from service.engines.sglang_sse import MAX_EVENT_BYTES, split_events

# Reading pauses while this much of received payloads waits for the reader.
PAUSE_BYTES = 1 << 20
# The part of a refusal's body that is kept for the error message.
ERROR_BODY_BYTES = 4096


class ConnectFailed(ConnectionError):
    """No connection to the worker could be made."""


class StreamLost(ConnectionError):
    """The connection closed before the response ended, or carried malformed HTTP."""


class SseConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one response at a time."""

    def __init__(self, on_idle_lost: Callable[[SseConnection], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_idle_lost = on_idle_lost
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.total_bytes = 0  # received since the connection opened (the watchdog's counter)
        self.lost = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.keep_alive = False
        self.done = False  # the whole response arrived
        self._framed = False  # chunked or Content-Length (else: the close ends the body)
        self._pieces: list[bytes] = []  # body not yet split into events
        self._payloads: list[bytes] = []
        self._pending_bytes = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._full = self._held = self._paused = False
        self._idle = False

    # -- asyncio.Protocol -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.total_bytes += len(data)
        if self._idle:  # nothing was asked: not a connection to reuse
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(StreamLost(f"malformed HTTP from the worker: {exc}"))
            self.close()
            return
        if self._pieces and self.status == 200:
            pieces = self._pieces
            buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            payloads, rest = split_events(buf)
            self._pieces = [rest] if rest else []
            if len(rest) > MAX_EVENT_BYTES:
                self.fail(UpstreamError(f"an SSE event exceeded {MAX_EVENT_BYTES} bytes"))
                self.close()
                return
            if payloads:
                self._payloads += payloads
                self._pending_bytes += len(buf) - len(rest)
                if self._pending_bytes > PAUSE_BYTES and not self._full:
                    self._full = True
                    self._update_reading()
                self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._idle:
            self._on_idle_lost(self)
        if self.status and not self._framed and not self.done:
            self.done = True  # a body delimited by the close: complete
            self._wake()
        elif not self.done:
            self.fail(StreamLost(f"connection lost{f': {exc}' if exc else ''}"))

    # -- httptools callbacks -------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or (
            lower == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.status == 200 or sum(map(len, self._pieces)) < ERROR_BODY_BYTES:
            self._pieces.append(body)

    def on_message_complete(self) -> None:
        self.done = True
        self._wake()

    # -- the reader's side -------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> None:
        assert self._transport is not None
        self._idle = False
        self._transport.write(head + body)

    @property
    def reading_paused(self) -> bool:
        return self._paused

    @property
    def pending_bytes(self) -> int:
        """Payload bytes received and not yet taken."""
        return self._pending_bytes

    @property
    def waiting(self) -> bool:
        """The reader is waiting for the worker (the watchdog's question)."""
        return self._waiter is not None

    async def headers(self) -> int:
        """Wait for the response's status line and headers; the status."""
        while not self.status:
            self._raise_error()
            await self._wait()
        return self.status

    async def payloads(self) -> list[bytes]:
        """Every SSE payload received and not yet taken; [] at the end of the body."""
        while True:
            if self._payloads:
                taken, self._payloads, self._pending_bytes = self._payloads, [], 0
                if self._full:
                    self._full = False
                    self._update_reading()
                return taken
            self._raise_error()
            if self.done:
                return []
            await self._wait()

    async def body(self) -> bytes:
        """The whole body of a non-SSE answer (its first `ERROR_BODY_BYTES` or so)."""
        while not self.done:
            self._raise_error()
            await self._wait()
        return b"".join(self._pieces)

    async def finished(self) -> None:
        """Wait for the end of the response (what is left is discarded)."""
        while not self.done:
            self._raise_error()
            self._payloads, self._pending_bytes = [], 0
            if self._full:
                self._full = False
                self._update_reading()
            await self._wait()

    async def hold(self, seconds: float) -> None:
        """Stop reading for `seconds`: what the worker sends meanwhile waits in the
        socket and arrives in one read (one split, one batch)."""
        self._held = True
        self._update_reading()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._held = False
            self._update_reading()

    def fail(self, exc: BaseException) -> None:
        """End the response with `exc` (raised to the reader after what it has not
        taken yet). The first failure wins."""
        if self._error is None and not self.done:
            self._error = exc
            self._wake()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.lost = True

    @property
    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.lost and self._error is None

    def make_idle(self) -> None:
        self._reset()
        self._idle = True

    # -- inside -----------------------------------------------------------------
    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _update_reading(self) -> None:
        transport = self._transport
        pause = self._full or self._held
        if pause == self._paused or transport is None or transport.is_closing():
            return
        self._paused = pause
        if pause:
            transport.pause_reading()
        else:
            transport.resume_reading()
