"""Follow one SGLang worker's KV cache events into a `CacheView`.

SGLang's ZMQ publisher (`--kv-events-config '{"publisher":"zmq",...}'`) sends
each batch as three frames: topic, an 8-byte big-endian sequence number (from 0
at the engine's start) and a msgpack `[ts, events, attn_dp_rank]` whose events
are maps tagged by `type` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
The schema below mirrors SGLang 0.5's (`sglang.srt.disaggregation.kv_events`),
decoded with msgspec as SGLang encodes it.

A gap in the sequence (the subscriber started late, or ZMQ dropped at its
high-water mark) is filled from the publisher's replay socket when one is
configured (a ROUTER: send the first missing sequence, read batches until the
end marker); otherwise, or when the replay buffer no longer reaches back, the
view is marked stale and the router uses the approximate index for that worker.

pyzmq and msgspec are the optional extra `kv-events`; `require()` says so in one
line at start-up when events are configured without them.
"""

from __future__ import annotations

import asyncio
import logging

from scheduler.tasks import stop_task
from service.engines.kv_view import CacheView

log = logging.getLogger(__name__)

_END_SEQ = -1  # the replay socket's end marker, as a signed 8-byte sequence


def require() -> None:
    """Fail with one clear line when the `kv-events` extra is missing."""
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"KV events are configured but {e.name} is not installed: "
            "pip install 'fairgate[kv-events]'"
        ) from None


class KvEventsFollower:
    """A SUB socket on one worker's events, applied to `view` as they come."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        require()
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.view = CacheView()
        self.last_seq = -1
        self.batches = 0
        from service.engines import kv_events_schema

        self._schema = kv_events_schema
        self._task: asyncio.Task[None] | None = None

    @property
    def exact(self) -> bool:
        return not self.view.stale

    def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self._sub.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
            self._sub.close(linger=0)
            self._ctx.term()

    async def _run(self) -> None:
        try:
            await self._follow()
        except asyncio.CancelledError:
            raise
        except Exception:  # an event this schema cannot read: not exact any more
            log.exception("kv events from %s: stopped following", self.endpoint)
            self.view.stale = True

    async def _follow(self) -> None:
        while True:
            _topic, seq_b, payload = await self._sub.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == 0 and self.last_seq >= 0:  # the engine restarted: empty again
                self.view.cleared()
                self.last_seq = -1
            if seq <= self.last_seq:
                continue  # replayed already
            if seq != self.last_seq + 1:
                await self._fill_gap(seq)
            if seq == self.last_seq + 1:
                self.apply(seq, payload)

    async def _fill_gap(self, upto_seq: int) -> None:
        """Batches last_seq+1 .. upto_seq-1 were missed: replay them, or go stale."""
        if self.replay_endpoint is not None:
            import zmq

            sock = self._ctx.socket(zmq.DEALER)
            sock.connect(self.replay_endpoint)
            try:
                await sock.send_multipart((b"", (self.last_seq + 1).to_bytes(8, "big")))
                while True:
                    frames = await asyncio.wait_for(sock.recv_multipart(), timeout=5.0)
                    seq = int.from_bytes(frames[2], "big", signed=True)
                    if seq == _END_SEQ:
                        break
                    if seq == self.last_seq + 1:
                        self.apply(seq, frames[3])
            except TimeoutError:
                log.warning("kv events replay from %s timed out", self.replay_endpoint)
            finally:
                sock.close(linger=0)
        if self.last_seq + 1 < upto_seq:  # the replay (if any) did not reach back
            log.warning(
                "kv events from %s: batches %d..%d missed; falling back to the index",
                self.endpoint,
                self.last_seq + 1,
                upto_seq - 1,
            )
            self.view.cleared()
            self.view.stale = True
            self.last_seq = upto_seq - 1

    def apply(self, seq: int, payload: bytes) -> None:
        """Batch `seq` (the next in order) into the view: what the socket delivers
        live, and the virtual fleet straight from its simulated engines."""
        schema, view = self._schema, self.view
        for ev in schema.DECODER.decode(payload).events:
            if isinstance(ev, schema.BlockStored):
                if ev.medium in (None, "GPU"):  # a lower tier is not reused as is
                    view.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
            elif isinstance(ev, schema.BlockRemoved):
                if ev.medium in (None, "GPU"):
                    view.removed(ev.block_hashes)
            else:
                view.cleared()
        self.last_seq = seq
        self.batches += 1
