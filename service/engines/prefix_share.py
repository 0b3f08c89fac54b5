"""Replicas tell each other what they routed where, through a Redis stream.

Each replica's pool keeps its own prefix index (`prefix_index.py`). With
several replicas over Redis, a conversation's turns may reach different
replicas; the one that routes a later turn must know where the earlier turns
went. So every replica appends, for each sequence it routes (the prompt when it
is sent, prompt plus output when it ends), the worker's URL and the sequence's
deepest prefix key to one stream, and reads the others' entries every
`interval_s` into its own index. A key stands for its whole prefix, so that
one key per sequence is enough (`PrefixIndex.match` looks for the deepest).

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
(`Placement.learn_load`). At most one entry per worker and round, only when the
count changed, and every worker's again every `load_refresh_s`, so that the
others can drop a replica that went silent (remote_load.py). And that a light
tenant's short request was placed (`publish_light`, at most one entry a round):
staggered prefill keeps a worker for an active light tenant, which a replica
must know of even when the other replicas placed its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
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
        learn_load: Callable[[str, str, int, int], None] | None = None,
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
        self.load_refresh_s = load_refresh_s
        # This replica's load per worker URL, and those changed since the last send.
        self._loads: dict[str, tuple[int, int]] = {}
        self._loads_changed: set[str] = set()
        self._loads_sent_s = -math.inf
        self.interval_s = interval_s
        self.maxlen = maxlen
        self.batch = batch
        self._out: list[dict[str, str]] = []
        self._last_id = "0-0"
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.sent_total = 0
        self.learned_total = 0
        self.rounds = 0

    def publish(self, url: str, key: int) -> None:
        """This replica routed the sequence `key` stands for to worker `url`."""
        self._send({"u": url, "k": str(key)})

    def publish_prefill(self, url: str, prefill_id: str, tokens: int) -> None:
        """This replica routed `tokens` uncached prompt tokens to worker `url` under
        `prefill_id` (0: that prefill is over)."""
        self._send({"u": url, "p": prefill_id, "n": str(tokens)})

    def publish_load(self, url: str, requests: int, kv_tokens: int) -> None:
        """This replica now has `requests` of `kv_tokens` in flight on worker `url`
        (sent with the next round, the latest count only)."""
        self._loads[url] = (requests, kv_tokens)
        self._loads_changed.add(url)

    def publish_light(self) -> None:
        """This replica placed a light tenant's short request (sent with the next round)."""
        self._light = True

    def _queue_loads(self) -> None:
        """The loads changed since the last round; every one once per refresh."""
        now_s = time.monotonic()
        if now_s - self._loads_sent_s >= self.load_refresh_s:
            self._loads_sent_s = now_s
            self._loads_changed.update(self._loads)
        for url in sorted(self._loads_changed):
            n, kv = self._loads[url]
            self._send({"u": url, "l": str(n), "v": str(kv)})
        self._loads_changed.clear()

    def _send(self, fields: dict[str, str]) -> None:
        if len(self._out) < self.batch:
            fields["r"] = self.replica_id
            self._out.append(fields)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="prefix-share")

    async def aclose(self) -> None:
        await stop_task(self._task)
        self._task = None
        await self.client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
                if self._failing:
                    log.info("prefix share: Redis is back")
                self._failing = False
            except UNAVAILABLE as exc:
                raise_if_cancelling(exc)
                if not self._failing:
                    log.warning(
                        "prefix share: Redis failed (%s); routing from this replica's routes", exc
                    )
                self._failing = True
            self.rounds += 1
            await asyncio.sleep(self.interval_s)

    async def sync(self) -> None:
        """Send what this replica routed since the last call; learn the others'."""
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
        while True:
            got = await self.client.xread({self.stream: self._last_id}, count=self.batch)
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
                self.learn_load(f["u"], f.get("r", ""), int(f["l"]), int(f["v"]))
            elif f.get("s") == "light" and self.learn_light is not None:
                self.learn_light()
            else:
                return
            self.learned_total += 1
