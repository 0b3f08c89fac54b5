"""SGLang's `/generate` SSE stream: the `data:` payloads of the complete events in
what was received (`split_events`, called per socket read by `sse_client.py`),
and which cumulative chunks a later one in the same batch makes redundant
(`superseded`).
"""

from __future__ import annotations

from typing import Any

MAX_EVENT_BYTES = 64 << 20


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """(the `data:` payloads of the complete events in `buf`, the incomplete rest).

    Splits on blank lines, tolerates CRLF and comments, joins the lines of a
    multi-line event. The common read, one event of one `data: ` line, takes a
    fast path (at 256 cumulative tokens: 0.5 µs against 2.8).
    """
    if buf.startswith(b"data: ") and buf.find(b"\n") == len(buf) - 2 and buf.endswith(b"\n\n"):
        return [buf[6:-2]], b""
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    blocks = buf.split(b"\n\n")
    rest = blocks.pop()
    payloads: list[bytes] = []
    for block in blocks:
        if block.startswith(b"data: ") and b"\n" not in block:
            payloads.append(block[6:])
            continue
        data = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            payloads.append(b"\n".join(data))
    return payloads, rest


def superseded(data: Any) -> bool:
    """A cumulative chunk that a later one in the same batch replaces: no error,
    no finish (those are decoded, and malformed ones refused, in any position)."""
    if not isinstance(data, dict) or "error" in data:
        return False
    meta = data.get("meta_info")
    return isinstance(meta, dict) and meta.get("finish_reason") is None
