"""Keep-alive connections to one engine URL for streamed POSTs (`sse_client.py`
is the connection and says why this client exists)."""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from service.engines.sse_client import ConnectFailed, SseConnection, StreamLost


class SsePool:
    """Keep-alive connections to one engine URL for streamed POSTs."""

    def __init__(self, url: str, connect_timeout_s: float, max_connections: int = 0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {url!r}: expected http(s)://host[:port][/prefix]")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._netloc = parts.netloc.rpartition("@")[2].encode("idna")  # no credentials
        self._prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: list[SseConnection] = []
        self._open: set[SseConnection] = set()
        self._busy: set[SseConnection] = set()  # taken, not handed back: one slot each
        self._drains: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> SseConnection:
        """Send `POST path` and wait for the answer's headers: the connection,
        which the caller hands back with `release` or `discard`."""
        head = self._head(path, len(body), headers)
        while True:
            conn = await self._take()
            before = conn.total_bytes
            conn.send(head, body)
            try:
                await conn.headers()
                return conn
            except StreamLost:
                # The server closed an idle connection as we reused it: once more, fresh.
                retry = conn.reused and conn.total_bytes == before
                self.discard(conn)
                if not retry:
                    raise
            except BaseException:
                self.discard(conn)
                raise

    def release(self, conn: SseConnection) -> None:
        """Hand back a connection whose response the caller read to its end, or is
        done with after its last useful event: the rest is read off in the
        background (at most `drain_s`) so that the connection can be reused."""
        if conn.done or conn.lost:
            self._settle(conn)
            return
        task = asyncio.get_running_loop().create_task(self._drain(conn))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def discard(self, conn: SseConnection) -> None:
        """Close the connection (the response is abandoned)."""
        conn.close()
        self._open.discard(conn)
        self._hand_back(conn)

    async def aclose(self) -> None:
        self._closed = True
        if self._drains:
            await asyncio.wait(list(self._drains), timeout=2.0)
        for conn in list(self._open):
            self.discard(conn)
        self._idle.clear()

    # -- inside -----------------------------------------------------------------
    def _head(self, path: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [
            f"POST {self._prefix}{path} HTTP/1.1".encode(),
            b"Host: " + self._netloc,
            b"Content-Length: " + str(length).encode(),
            b"Accept: text/event-stream",
        ]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r}: a line break in a header")
            lines.append(f"{name}: {value}".encode("latin-1"))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _take(self) -> SseConnection:
        if self._closed:
            raise ConnectFailed("the engine's connection pool is closed")
        # A slot per connection in use; an idle one is taken before a new one is
        # made, so open connections never exceed the limit either.
        if self._slots is not None:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.lost:
                    conn.reused = True
                    self._busy.add(conn)
                    return conn
                self._open.discard(conn)
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: SseConnection(self._idle_lost), self.host, self.port, ssl=self._ssl
                )
        except TimeoutError as exc:
            self._free_slot()
            raise ConnectFailed(f"no connection within {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            self._free_slot()
            raise ConnectFailed(str(exc)) from exc
        except BaseException:
            self._free_slot()
            raise
        self._open.add(conn)
        self._busy.add(conn)
        return conn

    async def _drain(self, conn: SseConnection) -> None:
        try:
            async with asyncio.timeout(1.0):
                await conn.finished()
        except (TimeoutError, ConnectionError):
            conn.close()
        self._settle(conn)

    def _settle(self, conn: SseConnection) -> None:
        if conn.reusable and not self._closed:
            conn.make_idle()
            self._idle.append(conn)
            self._hand_back(conn)
        else:
            self.discard(conn)

    def _idle_lost(self, conn: SseConnection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)
        self._open.discard(conn)

    def _hand_back(self, conn: SseConnection) -> None:
        if conn in self._busy:
            self._busy.discard(conn)
            self._free_slot()

    def _free_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()
