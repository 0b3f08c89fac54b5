"""Graceful shutdown of the inference service: refuse, fail the queue, drain, cut.

`App.stop` runs the steps for both fronts (gRPC and the OpenAI HTTP port);
service/generation.py, which both run every request through, tells this
object what it holds.

1. `begin()`: new Generate calls and every request still queued for
   admission fail at once with UNAVAILABLE + RetryInfo (HTTP: 503 +
   Retry-After; a queued request would only be cut later, another replica
   can serve it now). The server keeps listening, so health checks, also on
   new connections, answer NOT_SERVING (HTTP `/health`: 503) rather than
   failing to connect.
2. `wait_idle(grace_s)`: streams in flight finish on their own.
3. `cut()`: the streams still running are aborted in their engine, the way
   SGLang aborts a request: each ends with a final GenerateResult
   (FINISH_REASON_CANCELLED, usage so far) before its status, or with
   UNAVAILABLE + RetryInfo if it had produced nothing yet.

Queued requests are failed by cancelling their admission wait (the same path
as a client cancel, so the dispatcher dequeues them and charges nothing)
through `asyncio.Timeout`, which tells our cancellation from a client's.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from service.engines.protocol import Engine
from service.errors import Unavailable

log = logging.getLogger(__name__)

# How long a client should wait before retrying (on another replica, via the
# load balancer): about the time a balancer takes to notice NOT_SERVING.
RETRY_AFTER_S = 1.0
# After the grace: how long cut streams get to send their final result (both
# fronts) before the servers cancel what is left.
CUT_WAIT_S = 1.0


class ServerDraining(Unavailable):
    reason = "SERVER_SHUTTING_DOWN"

    def __init__(self, message: str = "the server is shutting down; retry") -> None:
        super().__init__(message)
        self.retry_after_s = RETRY_AFTER_S


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._queued: set[asyncio.Timeout] = set()
        # id of the request → (engine request id, its engine); ids sent by
        # clients need not be unique.
        self._streams: dict[int, tuple[str, Engine]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._cut_short = asyncio.Event()

    # -- the servicer's side ------------------------------------------------
    def queued(self) -> _QueuedWait:
        """`async with drain.queued(): await admit(...)`; raises ServerDraining."""
        return _QueuedWait(self)

    def stream_started(self, key: int, request_id: str, engine: Engine) -> None:
        self._streams[key] = (request_id, engine)
        self._idle.clear()

    def stream_ended(self, key: int) -> None:
        self._streams.pop(key, None)
        if not self._streams:
            self._idle.set()

    @property
    def streams(self) -> int:
        return len(self._streams)

    # -- App.stop's side ----------------------------------------------------
    def begin(self) -> int:
        """Refuse new requests and fail the queued ones; returns how many were queued."""
        self.draining = True
        loop = asyncio.get_running_loop()
        queued = list(self._queued)
        for timeout in queued:
            timeout.reschedule(loop.time())
        return len(queued)

    def cut_short(self) -> None:
        """End `wait_idle` now (a second SIGTERM)."""
        self._cut_short.set()

    async def wait_idle(self, grace_s: float) -> bool:
        """Wait for the streams in flight to end, at most `grace_s`; True if they did."""
        idle = asyncio.ensure_future(self._idle.wait())
        short = asyncio.ensure_future(self._cut_short.wait())
        try:
            await asyncio.wait({idle, short}, timeout=grace_s, return_when="FIRST_COMPLETED")
        finally:
            idle.cancel()
            short.cancel()
        return not self._streams

    async def cut(self, wait_s: float) -> int:
        """Abort the streams still running in their engines and give them `wait_s` to
        send their final result; returns how many were cut."""
        cut = list(self._streams.values())
        if cut:
            log.warning("shutdown: cutting %d streams still running", len(cut))
            await asyncio.gather(*(engine.abort(rid) for rid, engine in cut))
            with_timeout = asyncio.ensure_future(self._idle.wait())
            try:
                await asyncio.wait({with_timeout}, timeout=wait_s)
            finally:
                with_timeout.cancel()
        return len(cut)


class _QueuedWait:
    __slots__ = ("drain", "timeout")

    def __init__(self, drain: Drain) -> None:
        self.drain = drain
        self.timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        if self.drain.draining:
            raise ServerDraining()
        await self.timeout.__aenter__()
        self.drain._queued.add(self.timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drain._queued.discard(self.timeout)
        try:
            await self.timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as timed_out:
            raise ServerDraining() from timed_out
