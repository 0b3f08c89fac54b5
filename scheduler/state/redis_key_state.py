"""API keys' own limits in Redis: exact across replicas (scheduler/key_gate.py).

Key layout, per key id K (prefix p; `{k:K}` is the Redis Cluster hash tag, so
each script touches one key's slot only):

    p:{k:K}:b:K   HASH  the key's token buckets: rl, rts (requests), tl, tts (tokens),
                        with the tenant buckets' fields and helpers (lua_prelude.py's
                        `PRELUDE`, the Lua twin of rules.bucket_*); expires once full
    p:{k:K}:open  ZSET  request id -> lease expiry ms: the key's open requests
                        (max_concurrent); renewed by `renew` while they stay open, so
                        a dead replica's requests stop counting after one lease

Two scripts, one round trip each: TAKE at arrival (slot and buckets, all or
nothing) and RELEASE at settlement (what `rules.refund` gives back, the slot
freed), sent in the background so that settling never waits on Redis. Why not
the tenant's STEP: a key is checked once, at arrival, not at every scheduling
decision, so its state needs none of the domain's; and its own slot keeps it
off the domain's shard.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from redis.exceptions import NoScriptError

from scheduler.errors import StoreUnavailable
from scheduler.gate_stats import TenantBuckets, stored_buckets
from scheduler.key_gate import Take
from scheduler.quotas import BucketLimits
from scheduler.redis_io import UNAVAILABLE, Script, connect, text
from scheduler.state.lua_prelude import PRELUDE
from scheduler.state.redis_store import seen_levels
from scheduler.tasks import raise_if_cancelling

# Keeps a bucket hash until it is full again (then it is the same as none).
_KEEP = r"""
local function keep(h, rr, rb, tr, tb)
  local ms = 0
  if rr and rb then ms = math.max(ms, (rb - level(h, 'r', rr, rb)) / rr * 1000) end
  if tr and tb then ms = math.max(ms, (tb - level(h, 't', tr, tb)) / tr * 1000) end
  if ms > 0 then redis.call('PEXPIRE', h, math.ceil(ms) + 1000) else redis.call('DEL', h) end
end
-- ARGV: P, key id, tokens, rr, rb, tr, tb, max concurrent (-1 none), request id, lease ms
local kid, n = ARGV[2], tonumber(ARGV[3])
local rr, rb, tr, tb = opt(ARGV[4]), opt(ARGV[5]), opt(ARGV[6]), opt(ARGV[7])
local cap, rid, lease = opt(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local h, z = KEYS[1], KEYS[2]
"""

TAKE = (
    PRELUDE
    + _KEEP
    + r"""
if cap then
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  if redis.call('ZCARD', z) >= cap then return {'max_concurrent', '-1'} end
end
local lim, w = bucket_wait(kid, n, rr, rb, tr, tb)
if w ~= 0 then return {lim, fmt(w)} end
bucket_add(kid, -1, -n, rr, rb, tr, tb)
keep(h, rr, rb, tr, tb)
if cap then
  redis.call('ZADD', z, now + lease, rid)
  redis.call('PEXPIRE', z, math.ceil(lease))
end
return {'', '0'}
"""
)

# ARGV[3] / [11]: requests / tokens given back (negative: debt).
RELEASE = (
    PRELUDE
    + _KEEP
    + r"""
bucket_add(kid, tonumber(ARGV[11]), n, rr, rb, tr, tb)
if redis.call('EXISTS', h) == 1 then keep(h, rr, rb, tr, tb) end
redis.call('ZREM', z, rid)
return 1
"""
)

_TAKE, _RELEASE = Script.of(TAKE), Script.of(RELEASE)
NO_LIMIT = "-1"
log = logging.getLogger(__name__)


def _num(x: float | None) -> str:
    return NO_LIMIT if x is None else repr(float(x))


class RedisKeyState:
    def __init__(self, client: Any, *, prefix: str = "fg", lease_ttl_s: float = 10.0) -> None:
        if any(c in prefix for c in "{}"):
            raise ValueError("the Redis prefix may not contain braces")
        self._r = client
        self.prefix = prefix
        self.lease_ms = lease_ttl_s * 1000
        # Open requests with a slot here: renewed until released.
        self._open: dict[tuple[str, str], None] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self.release_failures = 0

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 1.0, **kwargs: Any) -> RedisKeyState:
        return cls(connect(url, timeout_s=timeout_s), **kwargs)

    def _base(self, key_id: str) -> str:
        return f"{self.prefix}:{{k:{key_id}}}"

    def _call(self, t: Take, tokens: float, extra: list[str]) -> tuple[list[str], list[str]]:
        base = self._base(t.key_id)
        b = t.buckets
        args = [base, t.key_id, repr(float(tokens))]
        args += [_num(b.requests_per_s), _num(b.requests_burst)]
        args += [_num(b.tokens_per_s), _num(b.tokens_burst)]
        args += [_num(t.max_concurrent), t.request_id, repr(self.lease_ms), *extra]
        return [f"{base}:b:{t.key_id}", f"{base}:open"], args

    async def _eval(self, script: Script, keys: list[str], args: list[str]) -> Any:
        try:
            try:
                return await self._r.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return await self._r.eval(script.source, len(keys), *keys, *args)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    async def take(self, t: Take) -> tuple[str, float]:
        keys, args = self._call(t, t.tokens, [])
        limit, wait = await self._eval(_TAKE, keys, args)
        w = float(text(wait))
        if not text(limit) and t.max_concurrent is not None:
            self._open[(t.key_id, t.request_id)] = None
        return text(limit), (math.inf if w < 0 else w / 1000)

    def release(self, t: Take, requests: float, tokens: float) -> None:
        self._open.pop((t.key_id, t.request_id), None)
        keys, args = self._call(t, tokens, [repr(float(requests))])
        self._background(self._release(keys, args))

    async def _release(self, keys: list[str], args: list[str]) -> None:
        try:
            await self._eval(_RELEASE, keys, args)
        except StoreUnavailable as exc:
            # Lost: the buckets refill anyway and the slot's lease runs out.
            self.release_failures += 1
            log.warning("a key's refund was not written (%s)", exc)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the releases in flight (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending))

    async def renew(self) -> None:
        """Extend the leases of this replica's open requests (one pipelined round trip)."""
        if not self._open:
            return
        until_ms = time.time() * 1000 + self.lease_ms  # NTP-close to Redis's TIME
        try:
            async with self._r.pipeline(transaction=False) as pipe:
                for key_id, request_id in list(self._open):
                    z = f"{self._base(key_id)}:open"
                    pipe.zadd(z, {request_id: until_ms}, xx=True)
                    pipe.pexpire(z, math.ceil(self.lease_ms))
                await pipe.execute()
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    async def run(self, interval_s: float) -> None:
        """Renew every `interval_s` (a third of the lease) until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.renew()
            except StoreUnavailable as exc:
                raise_if_cancelling(exc)
                log.warning("key leases not renewed: %s", exc)

    async def levels(self, key_id: str, buckets: BucketLimits) -> TenantBuckets:
        try:
            row = await self._r.hmget(f"{self._base(key_id)}:b:{key_id}", "rl", "rts", "tl", "tts")
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        seen = seen_levels(row, time.time() * 1000)
        r, t = seen.get("r"), seen.get("t")
        return stored_buckets(
            buckets,
            (r.level if r else None, t.level if t else None),
            (r.age_s if r else None, t.age_s if t else None),
        )

    async def aclose(self) -> None:
        await self.flush()
        await self._r.aclose()
