"""A read timeout for long streams that costs nothing per read.

A timer per read (aiohttp's `sock_read` cancels and re-creates one on every
`data_received`) would be one timer per streamed token on the SGLang adapter's
hot path. `ReadWatchdog` instead looks at the connection's byte counter from a
timer that fires a few times per timeout. The stream fails (with `ReadTimeout`,
raised to the pending read) only when its reader has been waiting for the peer
for `timeout_s` and no byte arrived meanwhile. Time the reader spends elsewhere
(a slow consumer, a coalescing window) is not the peer's silence. Detection
comes between `timeout_s` and about `(1 + 1/CHECKS) · timeout_s`.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

# Looks per timeout: the detection slack is timeout_s / CHECKS.
CHECKS = 4


class ReadTimeout(TimeoutError):
    """The peer sent nothing for the read timeout while the reader waited."""


class Watched(Protocol):
    """What the watchdog reads of a connection (`sse_client.SseConnection`)."""

    @property
    def total_bytes(self) -> int: ...

    @property
    def waiting(self) -> bool: ...

    def fail(self, exc: BaseException) -> None: ...


class ReadWatchdog:
    __slots__ = ("_conn", "_handle", "_last_active_s", "_loop", "_seen", "timeout_s")

    def __init__(self, conn: Watched, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._conn = conn
        self.timeout_s = timeout_s
        self._seen = conn.total_bytes
        self._last_active_s = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(
            timeout_s / CHECKS, self._look
        )

    def _look(self) -> None:
        now_s = self._loop.time()
        total = self._conn.total_bytes
        if total != self._seen or not self._conn.waiting:
            self._seen, self._last_active_s = total, now_s
        elif now_s - self._last_active_s >= self.timeout_s * (1 - 1e-9):  # float slack
            self._handle = None
            self._conn.fail(ReadTimeout(f"no data for {self.timeout_s:g} s"))
            return
        self._handle = self._loop.call_later(self.timeout_s / CHECKS, self._look)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
