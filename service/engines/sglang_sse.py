"""SGLang's `/generate` SSE stream: the `data:` payloads of every event already
received, one list per socket read (`event_batches`), and which cumulative
chunks a later one in the same read makes redundant (`superseded`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from service.engines.read_watchdog import ReadWatchdog
from service.engines.sglang_chunks import UpstreamError

MAX_EVENT_BYTES = 64 << 20


async def event_batches(
    resp: aiohttp.ClientResponse, url: str, watchdog: ReadWatchdog
) -> AsyncGenerator[list[bytes], None]:
    """SSE `data:` payloads, all those complete in one read at a time.

    Splits on blank lines, tolerates CRLF and comments; the common event (one
    `data: ` line) takes a fast path. Marks its waits for the read watchdog.
    """
    buf = b""
    content = resp.content
    taken_bytes = 0  # of the body, which nothing read before this loop
    while True:
        watchdog.waiting = True
        piece = await content.readany()
        watchdog.waiting = False
        if not piece:
            break
        taken_bytes += len(piece)
        # readany takes the HTTP chunks (one SSE event each) buffered when it ran;
        # taking them can resume a paused transport, which buffers more at once:
        # take that too (checked by the byte count: a read_nowait() per read costs
        # ~1 us), so everything received goes out as one chunk.
        while content.total_bytes > taken_bytes and (more := content.read_nowait()):
            taken_bytes += len(more)
            piece += more
        buf = buf + piece if buf else piece
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        blocks = buf.split(b"\n\n")
        buf = blocks.pop()
        payloads: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                payloads.append(block[6:])
                continue
            data = [
                line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
            ]
            if data:
                payloads.append(b"\n".join(data))
        if payloads:
            yield payloads
        if len(buf) > MAX_EVENT_BYTES:
            raise UpstreamError(f"{url}: an SSE event exceeded {MAX_EVENT_BYTES} bytes")


def superseded(data: Any) -> bool:
    """A cumulative chunk that a later one in the same batch replaces: no error,
    no finish (those are decoded, and malformed ones refused, in any position)."""
    if not isinstance(data, dict) or "error" in data:
        return False
    meta = data.get("meta_info")
    return isinstance(meta, dict) and meta.get("finish_reason") is None
