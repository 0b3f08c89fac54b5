"""Shapes of SGLang's HTTP answers, for comparing the stand-in with the real server.

A shape keeps what a client depends on (status, content type, keys, JSON types,
SSE event order) and drops values (text, ids, timings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

Shape = Any


def shape(value: Any) -> Shape:
    """JSON value → its shape: dict keys kept (sorted), lists by their first item."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


@dataclass(slots=True)
class Answer:
    status: int
    content_type: str
    body: Any  # parsed JSON, a list of SSE payloads (JSON or "[DONE]"), or raw text

    def shape(self) -> Shape:
        if isinstance(self.body, list) and self.content_type.startswith("text/event-stream"):
            return (self.status, self.content_type, sse_shape(self.body))
        return (self.status, self.content_type, shape(self.body))


def sse_shape(events: list[Any]) -> Shape:
    """First event, the distinct shapes in between, the last JSON event, the terminator."""
    data = [shape(e) for e in events if e != "[DONE]"]
    assert events and events[-1] == "[DONE]", events[-3:]
    middle = {json.dumps(s, sort_keys=True) for s in data[1:-1]}
    return {
        "first": data[0],
        "middle": sorted(middle),
        "last": data[-1] if len(data) > 1 else None,
        "end": "[DONE]",
    }


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    raw: bytes | None = None,
) -> Answer:
    kwargs: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=60)}
    if raw is not None:
        kwargs["data"] = raw
        kwargs["headers"] = {"content-type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    async with session.request(method, url, **kwargs) as resp:
        ctype = resp.headers.get("content-type", "")
        text = await resp.text()
    if ctype.startswith("text/event-stream"):
        events: list[Any] = []
        for block in text.split("\n\n"):
            if block.startswith("data: "):
                payload = block[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return Answer(resp.status, ctype, events)
    if ctype.startswith("application/json"):
        return Answer(resp.status, ctype, json.loads(text))
    return Answer(resp.status, ctype, text)
