"""Spend per calendar window: the usage log's counters, per tenant and per API key.

Every usage record (service/usage_log.py) adds to the counters of its
tenant's and, when it came with a key, its key's subject, in the day and the
month windows holding its time (scheduler/tenancy/budgets.py): prompt, cached
and completion tokens and one request; a refusal adds one refusal and one
under its reason. They are added where the record is written, once per record
(in Redis in the same script as the stream entry, behind the same marker), so
a batch retried after a lost reply counts nothing twice.

Layout: one hash per window, `<prefix>:{usage}:spend:<period>:<label>`, field
`<tenant>|<key>|<counter>` (key "" for the tenant's total; neither id may
contain "|"), under the usage log's `{usage}` hash tag (one Cluster slot with
the stream, as the script needs). A window's hash expires `KEEP_S[period]`
after the window ends: long enough to bill last month.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from scheduler.redis_io import text
from scheduler.tenancy.budgets import PERIODS, Spend, Window, window

if TYPE_CHECKING:
    from service.usage_log import UsageRecord

# How long a window's counters outlive it.
KEEP_S = {"day": 40 * 86_400, "month": 400 * 86_400}
# The counters a budget reads (the refusals are read with the whole window).
SPEND_COUNTERS = ("prompt", "cached", "completion", "requests")
REFUSED = "refused."  # + reason


def subject(tenant_id: str, key_id: str = "") -> str:
    return f"{tenant_id}|{key_id}"


def subjects_of(record: UsageRecord) -> list[str]:
    """The tenant's total, and the key's when the request came with one."""
    out = [subject(record.tenant_id)]
    if record.key_id:
        out.append(subject(record.tenant_id, record.key_id))
    return out


def increments(record: UsageRecord) -> list[tuple[str, int]]:
    """(counter, amount) that `record` adds to each of its subjects: the one rule,
    which the Redis script (usage_log._APPEND) states again in Lua."""
    if record.refusal:
        return [("refusals", 1), (REFUSED + record.refusal, 1)]
    return [
        ("prompt", record.prompt_tokens),
        ("cached", record.cached_tokens),
        ("completion", record.completion_tokens),
        ("requests", 1),
    ]


def windows_of(at_s: float, utc_offset_min: int) -> list[Window]:
    return [window(p, at_s, utc_offset_min) for p in PERIODS]


def hash_key(prefix: str, win: Window) -> str:
    return f"{prefix}:{{usage}}:spend:{win.period}:{win.label}"


def spends(fields: Mapping[str, int]) -> dict[tuple[str, str], Spend]:
    """A window's counters, field → value, as (tenant, key) → Spend."""
    raw: dict[tuple[str, str], dict[str, int]] = collections.defaultdict(dict)
    for name, value in fields.items():
        tenant, _, rest = name.partition("|")
        key, _, counter = rest.partition("|")
        raw[(tenant, key)][counter] = int(value)
    out = {}
    for who, c in raw.items():
        refused = {k.removeprefix(REFUSED): v for k, v in c.items() if k.startswith(REFUSED)}
        out[who] = Spend(
            prompt=c.get("prompt", 0),
            cached=c.get("cached", 0),
            completion=c.get("completion", 0),
            requests=c.get("requests", 0),
            refusals=c.get("refusals", 0),
            refused=refused,
        )
    return out


class MemorySpend:
    """The counters in this process (store=memory): window → field → value."""

    def __init__(self) -> None:
        self._windows: dict[Window, collections.Counter[str]] = {}

    def add(self, record: UsageRecord, utc_offset_min: int) -> None:
        now_s = record.finished_at_s
        for win in windows_of(now_s, utc_offset_min):
            counters = self._windows.get(win)
            if counters is None:
                counters = self._windows[win] = collections.Counter()
                self._forget(now_s)
            for who in subjects_of(record):
                for name, amount in increments(record):
                    counters[f"{who}|{name}"] += amount

    def _forget(self, now_s: float) -> None:
        for win in [w for w in self._windows if w.end_s + KEEP_S[w.period] < now_s]:
            del self._windows[win]

    def fields(self, win: Window, wanted: Sequence[str] | None = None) -> dict[str, int]:
        counters = self._windows.get(win, collections.Counter())
        if wanted is None:
            return dict(counters)
        return {f: counters[f] for f in wanted if f in counters}


def spend_fields(subjects: Iterable[str]) -> list[str]:
    """The fields a budget check reads for `subjects`."""
    return [f"{s}|{c}" for s in subjects for c in SPEND_COUNTERS]


# KEYS: the windows' hashes; ARGV: the fields. One round trip, one slot.
READ_FIELDS = """
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('HMGET', k, unpack(ARGV)) end
return out
"""


async def redis_fields(
    client: Any, prefix: str, wins: Sequence[Window], wanted: Sequence[str] | None
) -> list[dict[str, int]]:
    """Each window's counters from Redis: `wanted` fields (HMGET) or all (HGETALL)."""
    keys = [hash_key(prefix, w) for w in wins]
    if wanted is None:
        out = []
        for key in keys:
            raw = await client.hgetall(key)
            out.append({text(k): int(v) for k, v in raw.items()})
        return out
    rows = await client.eval(READ_FIELDS, len(keys), *keys, *wanted)
    return [{f: int(v) for f, v in zip(wanted, row, strict=True) if v is not None} for row in rows]
