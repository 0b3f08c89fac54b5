"""Replicas tell each other what they routed where, through a Redis stream.

Each replica's pool keeps its own prefix index (`prefix_index.py`). With
several replicas over Redis, a conversation's turns may reach different
replicas; the one that routes a later turn must know where the earlier turns
went. So every replica appends, for each sequence it routes (the prompt when it
is sent, prompt plus output when it ends), the worker's URL and the sequence's
deepest prefix key to one stream, and reads the others' entries into its own
index. A key stands for its whole prefix, so that
one key per sequence is enough (`PrefixIndex.match` looks for the deepest).

A prefill's start and end, and a light request placed, are sent at once (the
sender wakes for them), and each replica reads with a blocking `XREAD`, so the
others know of a long prefill within a round trip: two replicas that each keep
a worker free for the light tenant must not fill each other's in the 50-100 ms a
polled read leaves. Everything else goes every `interval_s`.

Redis faults cost locality only: entries not sent or not read are not retried,
routing goes on from the local index, and a warning is logged once per outage.
The stream is capped (`maxlen`, approximately); a replica that starts reads what
is still there.

The same stream carries each long prefill a replica routes and its end (the
first token, or the request leaving): staggered prefill keeps one worker on
short steps and routes a light request where its first step ends soonest
(`Placement._staggered`, `routing.route`), which two replicas can only do when
each counts the prefill the other sent (`Placement.learn_prefill`). A prefill
whose end is lost (its replica died) stops counting after the placement's TTL.

And each replica's requests and KV in flight per worker (`publish_load`): a
worker the other replicas filled is full for this one's routing too
(`Placement.learn_load`). At most one entry per worker and send, only when the
count changed, and every worker's again every `load_refresh_s`, so that the
others can drop a replica that went silent (remote_load.py). With them its
quiet prefill there (the short prompts not announced one by one, not yet
streamed): when that changed, sent at once, as a prefill is (a light request's
step packs whatever short prompts wait at its engine, whichever replica sent
them). And that a light
tenant's short request was placed (`publish_light`, at most one entry a send):
staggered prefill keeps a worker for an active light tenant, which a replica
must know of even when the other replicas placed its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from scheduler.redis_io import UNAVAILABLE, text
from scheduler.tasks import raise_if_cancelling, stop_task

log = logging.getLogger(__name__)


class PrefixShare:
    def __init__(
        self,
        client: Any,
        stream: str,
        replica_id: str,
        learn: Callable[[str, int], None],
        *,
        learn_prefill: Callable[[str, str, int], None] | None = None,
        learn_load: Callable[[str, str, int, int, int], None] | None = None,
        learn_light: Callable[[], None] | None = None,
        interval_s: float = 0.05,
        load_refresh_s: float = 1.0,
        maxlen: int = 50_000,
        batch: int = 2_000,
    ) -> None:
        self.client = client
        self.stream = stream
        self.replica_id = replica_id
        self.learn = learn
        self.learn_prefill = learn_prefill
        self.learn_load = learn_load
        self.learn_light = learn_light
        self._light = False  # a light request placed since the last round
        # Set by what the other replicas need at once (a prefill, a light request).
        self._urgent = asyncio.Event()
        self.load_refresh_s = load_refresh_s
        # This replica's load per worker URL (requests, KV, quiet prefill), and
        # those changed since the last send.
        self._loads: dict[str, tuple[int, int, int]] = {}
        self._loads_changed: set[str] = set()
        self._loads_sent_s = -math.inf
        self.interval_s = interval_s
        self.maxlen = maxlen
        self.batch = batch
        self._out: list[dict[str, str]] = []
        self._last_id = "0-0"
        # The sender and the reader, each stopped on its own (`stop_task`): a gather
        # of the two could end on one's error and leave the other running.
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = False
        self.sent_total = 0
        self.learned_total = 0
        self.rounds = 0

    def publish(self, url: str, key: int) -> None:
        """This replica routed the sequence `key` stands for to worker `url`."""
        self._send({"u": url, "k": str(key)})

    def publish_prefill(self, url: str, prefill_id: str, tokens: int) -> None:
        """This replica routed `tokens` uncached prompt tokens to worker `url` under
        `prefill_id` (0: that prefill is over); sent at once."""
        self._send({"u": url, "p": prefill_id, "n": str(tokens)})
        self._urgent.set()

    def publish_load(self, url: str, requests: int, kv_tokens: int, prefill: int = 0) -> None:
        """This replica now has `requests` of `kv_tokens` in flight on worker `url`,
        `prefill` tokens of them quiet prefill (sent with the next round, the latest
        count only; at once when the prefill changed)."""
        before = self._loads.get(url)
        self._loads[url] = (requests, kv_tokens, prefill)
        self._loads_changed.add(url)
        if prefill != (before[2] if before else 0):
            self._urgent.set()

    def publish_light(self) -> None:
        """This replica placed a light tenant's short request (sent at once, one entry
        for those placed meanwhile)."""
        self._light = True
        self._urgent.set()

    def _queue_loads(self) -> None:
        """The loads changed since the last round; every one once per refresh."""
        now_s = time.monotonic()
        if now_s - self._loads_sent_s >= self.load_refresh_s:
            self._loads_sent_s = now_s
            self._loads_changed.update(self._loads)
        for url in sorted(self._loads_changed):
            n, kv, prefill = self._loads[url]
            self._send({"u": url, "l": str(n), "v": str(kv), "q": str(prefill)})
        self._loads_changed.clear()

    def _send(self, fields: dict[str, str]) -> None:
        if len(self._out) < self.batch:
            fields["r"] = self.replica_id
            self._out.append(fields)

    async def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._sending(), name="prefix-share-send"),
                asyncio.create_task(self._reading(), name="prefix-share-read"),
            ]

    async def aclose(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks = []
        await self.client.aclose()

    async def _sending(self) -> None:
        """Every `interval_s`, or at once when something urgent was published."""
        while True:
            self._urgent.clear()
            sent = await self._safely(self.send())
            self.rounds += 1
            if not sent:
                await asyncio.sleep(self.interval_s)  # down: no faster than a round
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._urgent.wait()

    async def _reading(self) -> None:
        """The others' entries as they come (a blocking read, `interval_s` at most)."""
        block_ms = max(1, int(self.interval_s * 1000))
        while True:
            if not await self._safely(self.read(block_ms)):
                await asyncio.sleep(self.interval_s)

    async def _safely(self, call: Coroutine[Any, Any, None]) -> bool:
        """Run one Redis call; a fault is logged once per outage, never raised."""
        try:
            await call
        except UNAVAILABLE as exc:
            raise_if_cancelling(exc)
            if not self._failing:
                log.warning(
                    "prefix share: Redis failed (%s); routing from this replica's routes", exc
                )
            self._failing = True
            return False
        if self._failing:
            log.info("prefix share: Redis is back")
        self._failing = False
        return True

    async def sync(self) -> None:
        """Send what this replica routed since the last call; learn the others'."""
        await self.send()
        await self.read()

    async def send(self) -> None:
        """What this replica routed since the last send."""
        self._queue_loads()
        if self._light:
            self._light = False
            self._send({"u": "", "s": "light"})
        out, self._out = self._out, []
        if out:
            pipe = self.client.pipeline(transaction=False)
            for fields in out:
                pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
            await pipe.execute()
            self.sent_total += len(out)

    async def read(self, block_ms: int | None = None) -> None:
        """The others' entries since the last read; with `block_ms`, waiting that long
        for the first when there is none yet."""
        while True:
            got = await self.client.xread(
                {self.stream: self._last_id}, count=self.batch, block=block_ms
            )
            block_ms = None
            entries = got[0][1] if got else []
            for entry_id, fields in entries:
                self._last_id = text(entry_id)
                f = {text(k): text(v) for k, v in fields.items()}
                if f.get("r") != self.replica_id and "u" in f:
                    self._learn(f)
            if len(entries) < self.batch:
                return

    def _learn(self, f: dict[str, str]) -> None:
        """One entry of another replica's (a malformed one is skipped)."""
        with contextlib.suppress(ValueError):
            if "k" in f:
                self.learn(f["u"], int(f["k"]))
            elif "p" in f and "n" in f and self.learn_prefill is not None:
                self.learn_prefill(f["u"], f"{f.get('r', '')}:{f['p']}", int(f["n"]))
            elif "l" in f and "v" in f and self.learn_load is not None:
                quiet = int(f.get("q", "0"))  # absent from an older replica's
                self.learn_load(f["u"], f.get("r", ""), int(f["l"]), int(f["v"]), quiet)
            elif f.get("s") == "light" and self.learn_light is not None:
                self.learn_light()
            else:
                return
            self.learned_total += 1
