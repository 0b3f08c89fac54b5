"""The usage log: one record per request that reached the engine, for billing.

A lifecycle observer (service/lifecycle.py) takes each request's final usage
when its engine stream ends (finished, failed or cancelled: what the engine
served is what is billed) and appends a `UsageRecord` to the log; the admin API
(`ExportUsage`) reads it from a cursor, oldest first. Never a step of the
request: appending is a list append, the writes happen in the background.

- `MemoryUsageLog` (store=memory): in this process, the last `max_records`;
  lost when it stops (`durable` is False, and the export says so).
- `RedisUsageLog` (store=redis): every replica appends to one Redis stream
  (`<prefix>:{usage}:log`), batched every `flush_s`. Each record is written
  once per request id (a `SET NX` marker beside it, kept `dedupe_ttl_s`, in the
  same Lua call), so a batch retried after a lost reply is not counted twice.
  While Redis is unreachable records wait in a bounded buffer and go when it is
  back; what the buffer drops past `max_buffered` is counted and logged. The
  stream survives restarts of fairgate; it survives a Redis restart as far as
  Redis persists it (AOF `appendfsync everysec` loses at most a second of
  records, docs/operations.md). A consumer that resumes from the last
  `next_cursor` it stored sees each record exactly once.

A request refused at admission (budget, quota, queue full, queue timeout,
deadline, store down, draining) is recorded too, once, with finish reason
"refused" and its reason (`refusal`), no tokens. Every record also adds to
the spend per calendar window (service/period_usage.py) that budgets and
`admin usage --period` read, in the same write.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import operator
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scheduler.redis_io import UNAVAILABLE, text
from scheduler.tasks import raise_if_cancelling
from scheduler.tenancy.budgets import Window
from service import period_usage
from service.lifecycle import QuietObserver

if TYPE_CHECKING:
    from scheduler.request import QueuedRequest
    from service.models import ServedModel

log = logging.getLogger(__name__)

MAX_EXPORT = 10_000


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    tenant_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    # stop, length, cancelled, error; "incomplete": the stream ended without a
    # result (the client left, or the engine failed before any output).
    finish_reason: str
    finished_at_s: float  # Unix time
    cursor: str = ""  # its position in the log, once read back
    key_id: str = ""  # the API key it came with ("" without one)
    refusal: str = ""  # set (finish_reason "refused"): the reason it was refused
    # What makes it once: the request id for a served request; a refusal's own id
    # (the client may retry under the same request id).
    record_id: str = ""


class UsageLog(Protocol):
    durable: bool
    # The windows' boundaries: local midnight at UTC + this offset (budget_utc_offset_min).
    utc_offset_min: int

    def append(self, record: UsageRecord) -> None: ...

    async def window_fields(
        self, wins: list[Window], wanted: list[str] | None = None
    ) -> list[dict[str, int]]:
        """Each window's spend counters (service/period_usage.py): `wanted` fields,
        or all of them."""
        ...

    async def read(self, cursor: str, limit: int) -> tuple[list[UsageRecord], str]:
        """Records after `cursor` ("" = from the start), oldest first, at most
        `limit`; and the cursor to resume from."""
        ...

    async def aclose(self) -> None: ...


class _Observer(QuietObserver):
    """One request's usage: taken when its engine stream ends, appended once the
    code that ended it has run (its result's finish reason, if it has one)."""

    wants_text = False

    def __init__(self, usage: UsageLog, req: QueuedRequest, model: str) -> None:
        self._usage, self._req, self._model = usage, req, model
        self._counts = (0, 0, 0)
        self._finish = "incomplete"

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        self._counts = (prompt_tokens, cached_tokens, completion_tokens)
        # `settled` follows in the same step when the request gets a result; a
        # request cancelled or failed before any output gets none.
        asyncio.get_running_loop().call_soon(self._append)

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        self._finish = finish_reason

    def refused(self, reason: str) -> None:
        # Its own record id: the client may retry under the same request id.
        rid = f"{self._req.request_id}/refused/{uuid.uuid4().hex[:16]}"
        self._record((0, 0, 0), "refused", refusal=reason, record_id=rid)

    def _append(self) -> None:
        self._record(self._counts, self._finish)

    def _record(self, counts: tuple[int, int, int], finish: str, **extra: str) -> None:
        req = self._req
        prompt, cached, completion = counts
        self._usage.append(
            UsageRecord(
                req.request_id,
                req.tenant_id,
                self._model,
                prompt,
                cached,
                completion,
                finish,
                time.time(),
                key_id=req.key_id,
                **extra,
            )
        )


def observer_factory(usage: UsageLog) -> Any:
    """The lifecycle `ObserverFactory` that feeds `usage`."""

    def observe(req: QueuedRequest, model: ServedModel, prompt: str | None) -> _Observer:
        return _Observer(usage, req, model.name)

    return observe


# A record's fields in order, read at once: the memory log keeps them as a plain tuple.
_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(UsageRecord)))


class MemoryUsageLog:
    """The last `max_records` records, in this process (cursor: a sequence number).

    Kept as tuples of their fields, not as records: the collector stops tracking a
    tuple of strings and numbers, and a full log (100 000 objects) would otherwise
    be walked by every full collection while every stream waits."""

    durable = False

    def __init__(self, max_records: int = 100_000, *, utc_offset_min: int = 0) -> None:
        self._rows: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=max_records)
        self._next = 1  # the next record's cursor
        self.utc_offset_min = utc_offset_min
        self._spend = period_usage.MemorySpend()

    def append(self, record: UsageRecord) -> None:
        self._rows.append(_FIELDS(dataclasses.replace(record, cursor=str(self._next))))
        self._next += 1
        self._spend.add(record, self.utc_offset_min)

    async def window_fields(
        self, wins: list[Window], wanted: list[str] | None = None
    ) -> list[dict[str, int]]:
        return [self._spend.fields(w, wanted) for w in wins]

    async def read(self, cursor: str, limit: int) -> tuple[list[UsageRecord], str]:
        # Cursors are consecutive: the oldest kept is `_next - len(_rows)`.
        skip = max(0, int(cursor or 0) + 1 - (self._next - len(self._rows)))
        out = [UsageRecord(*row) for row in itertools.islice(self._rows, skip, skip + limit)]
        return out, out[-1].cursor if out else cursor

    async def aclose(self) -> None:
        pass


# KEYS[1]: the stream; ARGV[1]: the marker keys' prefix, ARGV[2]: their TTL (s),
# ARGV[3]: the spend hashes' prefix; then 15 values per record. Markers and spend
# hashes share the stream's {usage} hash tag (one slot). The spend counted is
# period_usage.increments' rule, stated again here.
_APPEND = """
local n = 0
for i = 4, #ARGV, 15 do
  local tenant, key, refusal = ARGV[i + 2], ARGV[i + 9], ARGV[i + 10]
  if redis.call('SET', ARGV[1] .. ARGV[i], '1', 'NX', 'EX', ARGV[2]) then
    redis.call('XADD', KEYS[1], '*', 'rid', ARGV[i + 1], 'tenant', tenant,
      'model', ARGV[i + 3], 'prompt', ARGV[i + 4], 'cached', ARGV[i + 5],
      'completion', ARGV[i + 6], 'finish', ARGV[i + 7], 'at', ARGV[i + 8],
      'key', key, 'refusal', refusal)
    local subjects = {tenant .. '|'}
    if key ~= '' then subjects[2] = tenant .. '|' .. key end
    for w = i + 11, i + 13, 2 do
      local h = ARGV[3] .. ARGV[w]
      for _, s in ipairs(subjects) do
        if refusal == '' then
          redis.call('HINCRBY', h, s .. '|prompt', ARGV[i + 4])
          redis.call('HINCRBY', h, s .. '|cached', ARGV[i + 5])
          redis.call('HINCRBY', h, s .. '|completion', ARGV[i + 6])
          redis.call('HINCRBY', h, s .. '|requests', 1)
        else
          redis.call('HINCRBY', h, s .. '|refusals', 1)
          redis.call('HINCRBY', h, s .. '|refused.' .. refusal, 1)
        end
      end
      redis.call('EXPIREAT', h, ARGV[w + 1])
    end
    n = n + 1
  end
end
return n
"""


class RedisUsageLog:
    """One Redis stream for the whole fleet (see the module's docstring)."""

    durable = True

    def __init__(
        self,
        client: Any,
        prefix: str,
        *,
        flush_s: float = 0.05,
        max_buffered: int = 100_000,
        dedupe_ttl_s: int = 7 * 86_400,
        utc_offset_min: int = 0,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.utc_offset_min = utc_offset_min
        self.stream = f"{prefix}:{{usage}}:log"
        self._marker = f"{prefix}:{{usage}}:rid:"
        self._spend = f"{prefix}:{{usage}}:spend:"
        self.flush_s, self.max_buffered, self.dedupe_ttl_s = flush_s, max_buffered, dedupe_ttl_s
        self._buffer: collections.deque[UsageRecord] = collections.deque()
        self.dropped = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._warned = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-log")

    def append(self, record: UsageRecord) -> None:
        if len(self._buffer) >= self.max_buffered:
            self._buffer.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("usage log: Redis unreachable, %d records dropped", self.dropped)
        self._buffer.append(record)
        self._wake.set()

    async def _run(self) -> None:
        # A stop flag rather than cancellation alone: redis-py may turn a cancel that
        # lands inside a command into a connection error, which `flush` absorbs.
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush() and not self._closing:
                await asyncio.sleep(1.0)  # Redis is down: try again, the buffer waits
                self._wake.set()
            if not self._closing:
                await asyncio.sleep(self.flush_s)

    async def flush(self) -> bool:
        """Write what is buffered; False when Redis refused (nothing is lost)."""
        while self._buffer:
            batch = list(self._buffer)[:500]
            args: list[Any] = [self._marker, self.dedupe_ttl_s, self._spend]
            for r in batch:
                args += [r.record_id or r.request_id, r.request_id, r.tenant_id, r.model]
                args += [r.prompt_tokens, r.cached_tokens, r.completion_tokens]
                args += [r.finish_reason, f"{r.finished_at_s:.3f}", r.key_id, r.refusal]
                for win in period_usage.windows_of(r.finished_at_s, self.utc_offset_min):
                    keep_until = int(win.end_s) + period_usage.KEEP_S[win.period]
                    args += [f"{win.period}:{win.label}", keep_until]
            try:
                await self.client.eval(_APPEND, 1, self.stream, *args)
            except UNAVAILABLE as exc:
                raise_if_cancelling(exc)
                if not self._warned:
                    log.warning("usage log: Redis unreachable, records wait: %s", exc)
                    self._warned = True
                return False
            self._warned = False
            for r in batch:  # the buffer may have dropped some meanwhile (max_buffered)
                if self._buffer and self._buffer[0] is r:
                    self._buffer.popleft()
        return True

    async def read(self, cursor: str, limit: int) -> tuple[list[UsageRecord], str]:
        start = f"({cursor}" if cursor else "-"
        rows = await self.client.xrange(self.stream, start, "+", count=limit)
        out = []
        for rid, fields in rows:
            f = {text(k): text(v) for k, v in fields.items()}
            out.append(
                UsageRecord(
                    f["rid"],
                    f["tenant"],
                    f["model"],
                    int(f["prompt"]),
                    int(f["cached"]),
                    int(f["completion"]),
                    f["finish"],
                    float(f["at"]),
                    text(rid),
                    key_id=f.get("key", ""),
                    refusal=f.get("refusal", ""),
                )
            )
        return out, out[-1].cursor if out else cursor

    async def window_fields(
        self, wins: list[Window], wanted: list[str] | None = None
    ) -> list[dict[str, int]]:
        return await period_usage.redis_fields(self.client, self.prefix, wins, wanted)

    async def aclose(self) -> None:
        """Write what is left (a few seconds at most), stop, close the client."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3.0):
                for _ in range(15):  # Redis may be back within the 3 s
                    if await self.flush():
                        break
                    await asyncio.sleep(0.2)
        if self._buffer:
            log.error("usage log: %d records not written at shutdown", len(self._buffer))
        await self.client.aclose()
