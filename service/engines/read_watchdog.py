"""A read timeout for long streams that costs nothing per read.

aiohttp's `sock_read` timeout cancels and re-creates a timer on every
`data_received`: one timer per streamed token on the SGLang adapter's hot path.
`ReadWatchdog` instead looks at the response's byte counter from a timer that
fires a few times per timeout. The stream fails (with
`aiohttp.ServerTimeoutError`, raised by the pending read, as `sock_read` would)
only when its reader has been waiting for the peer for `timeout_s` and no byte
arrived meanwhile. Time the reader spends elsewhere (a slow consumer, a
coalescing window) is not the peer's silence. Detection comes between
`timeout_s` and about `(1 + 1/CHECKS) · timeout_s`.

The reader marks its waits: `waiting = True` before a read that may block,
`False` after (two attribute stores per read).
"""

from __future__ import annotations

import asyncio

import aiohttp

# Looks per timeout: the detection slack is timeout_s / CHECKS.
CHECKS = 4


class ReadWatchdog:
    __slots__ = ("_content", "_handle", "_last_active_s", "_loop", "_seen", "timeout_s", "waiting")

    def __init__(self, content: aiohttp.StreamReader, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._content = content
        self.timeout_s = timeout_s
        self.waiting = False
        self._seen = content.total_bytes
        self._last_active_s = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(
            timeout_s / CHECKS, self._look
        )

    def _look(self) -> None:
        now_s = self._loop.time()
        total = self._content.total_bytes
        if total != self._seen or not self.waiting:
            self._seen, self._last_active_s = total, now_s
        elif now_s - self._last_active_s >= self.timeout_s * (1 - 1e-9):  # float slack
            self._handle = None
            self._content.set_exception(
                aiohttp.ServerTimeoutError(f"no data for {self.timeout_s:g} s")
            )
            return
        self._handle = self._loop.call_later(self.timeout_s / CHECKS, self._look)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
