"""The simulator's KV events: what its radix cache stores and evicts, framed as
SGLang publishes them (`--kv-events-config '{"publisher":"zmq","endpoint":...}'`),
so the exact cache view (`service/engines/kv_events.py`) runs without a GPU.

Like the CPU server (page size 1), every token is a block: its hash stands for
the prefix ending at it (a chain over the tokens, as SGLang's), a node's event
lists its tokens' hashes and links to the hash of the token before it (None
under the root). Each event goes out as its own batch with the next sequence
number: over a ZMQ PUB socket (`SimKvEventsPublisher`), or in simulated time
straight to a follower (`SimKvEvents` with its own `send`: the virtual fleet).
Not modelled: the replay socket (a subscriber that misses a batch falls back to
the approximate index).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from service.engines import kv_events
from service.engines.simulator.radix import Node

# One batch as SGLang sends it: topic, 8-byte big-endian sequence number, msgpack.
Frames = tuple[bytes, bytes, bytes]


class SimKvEvents:
    """One radix cache's events (`CacheObserver`), each batch handed to `send`."""

    def __init__(
        self,
        send: Callable[[Frames], object],
        topic: bytes = b"",
        clock: Callable[[], float] = time.time,
    ) -> None:
        kv_events.require()
        from service.engines import kv_events_schema

        self._schema = kv_events_schema
        self._send_frames = send
        self._topic = topic
        self._clock = clock
        self._seq = 0

    def stored(self, node: Node) -> None:
        tokens, first = _path(node)
        hashes = _block_hashes(tokens)
        self._send(
            self._schema.BlockStored(
                block_hashes=hashes[first:],
                parent_block_hash=hashes[first - 1] if first else None,
                token_ids=list(node.key),
                block_size=1,
                medium="GPU",
            )
        )

    def removed(self, node: Node) -> None:
        tokens, first = _path(node)
        self._send(self._schema.BlockRemoved(_block_hashes(tokens)[first:], medium="GPU"))

    def cleared(self) -> None:
        self._send(self._schema.AllBlocksCleared())

    def _send(self, event: object) -> None:
        batch = self._schema.KVEventBatch(ts=self._clock(), events=[event], attn_dp_rank=0)  # type: ignore[list-item]
        payload = self._schema.ENCODER.encode(batch)
        self._send_frames((self._topic, self._seq.to_bytes(8, "big"), payload))
        self._seq += 1


class SimKvEventsPublisher(SimKvEvents):
    """`SimKvEvents` on a ZMQ PUB socket, as `--kv-events-config` configures it."""

    def __init__(self, config_json: str) -> None:
        kv_events.require()
        import zmq

        config = json.loads(config_json)
        if config.get("publisher") != "zmq":
            raise SystemExit(f"--kv-events-config: publisher must be 'zmq' ({config_json})")
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.bind(str(config.get("endpoint", "tcp://*:5557")))
        super().__init__(self._pub.send_multipart, str(config.get("topic", "")).encode())

    def close(self) -> None:
        self._pub.close(linger=0)
        self._ctx.term()


def _path(node: Node) -> tuple[list[int], int]:
    """The tokens from the root to the end of `node`, and where `node`'s start."""
    parts: list[list[int]] = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        parts.append(n.key)
        n = n.parent
    tokens = [t for part in reversed(parts) for t in part]
    return tokens, len(tokens) - len(node.key)


def _block_hashes(tokens: list[int]) -> list[int]:
    """One hash per token, each over the prefix ending at it (int64, as SGLang's)."""
    out, h = [], 0
    for t in tokens:
        h = hash((h, t))
        out.append(h)
    return out
