"""`split_events`: SSE bytes as received → the complete events' `data:` payloads
and the incomplete rest, the one-event fast path and the general path alike."""

from __future__ import annotations

import pytest

from service.engines.sglang_sse import split_events


@pytest.mark.parametrize(
    ("received", "payloads", "rest"),
    [
        (b'data: {"a": 1}\n\n', [b'{"a": 1}'], b""),  # the fast path
        (b"data: \n\n", [b""], b""),
        (b"data: x\n\ndata: y\n\n", [b"x", b"y"], b""),
        (b"data: x\n\ndata: y", [b"x"], b"data: y"),
        (b"data: x\n", [], b"data: x\n"),  # not yet ended
        (b"data: x\r\n\r\n", [b"x"], b""),
        (b"data: x\r\n\r", [], b"data: x\n\r"),  # the rest of CRLF comes with the next read
        (b": a comment\n\ndata: x\n\n", [b"x"], b""),
        (b"data: x\ndata:  y\n\n", [b"x\ny"], b""),  # multi-line: joined, leading spaces dropped
        (b"event: e\ndata: x\n\n", [b"x"], b""),
        (b"data: x\n\n\n\n", [b"x"], b""),
    ],
)
def test_split_events(received: bytes, payloads: list[bytes], rest: bytes) -> None:
    assert split_events(received) == (payloads, rest)


def test_a_crlf_split_across_reads_ends_the_event() -> None:
    payloads, rest = split_events(b"data: x\r\n\r")
    assert payloads == [] and split_events(rest + b"\n") == ([b"x"], b"")
