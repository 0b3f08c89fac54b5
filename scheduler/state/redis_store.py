"""The Redis `Store`: fleet-wide scheduling state shared by every replica.

With `redis_io.py` (the client: connection, scripts, failures), the only
module of `scheduler/` that imports redis besides the tenant store. Key layout, for one
engine domain D (the engine or worker pool every replica admits into) and
prefix p (default "fg"); `{D}` is the Redis Cluster hash tag:

    p:{D}:vtc        HASH   tenant -> virtual token counter
    p:{D}:floor      STRING counter of the last tenant served (lifts newcomers)
    p:{D}:bl         ZSET   "replica\\0tenant" -> expiry ms (backlog heartbeats)
    p:{D}:blq        HASH   "replica\\0tenant" -> its queue length there, capped
                     (light or heavy fleet-wide, for the reserve)
    p:{D}:ls         ZSET   lease id -> expiry ms (in-flight leases)
    p:{D}:lt / :lk   HASH   lease id -> tenant / KV tokens
    p:{D}:in         HASH   n, kv, c:<tenant>, kv:<tenant> (fleet-wide in-flight counts)
    p:{D}:w          HASH   tenant -> weight (shares of the fair-share reserve)
    p:{D}:rc         ZSET   tenant -> until when it counts as active for the reserve
                     after its last request left (the reserve window)
    p:{D}:la / :adm  HASH / STRING tenant -> ordinal of its last admission / the
                     ordinal counter (ties between equal counters: least recent first)
    p:{D}:done       ZSET   settled lease id -> expiry ms (idempotent settlement)
    p:{D}:epoch      STRING exists while the state is intact (detects a wiped Redis)
    p:{D}:rep        ZSET   replica -> expiry (wall-clock s): live replicas, renewed
                     every heartbeat by `observe` (the fail-open divisor)
    p:{D}:use        HASH   replica -> its per-tenant usage (JSON, fleet_usage.py),
                     written by `observe`; a dead replica's is dropped when read
    p:{D}:b:<tenant> HASH   token buckets: rl, rts (requests), tl, tts (tokens)
    p:{t:<tenant>}:cfg HASH tenant configuration (published, not on the hot path)

Why the per-tenant buckets live in the domain's slot rather than under a
`{tenant}` tag: one decision must read every candidate tenant's counter and
buckets, the fleet's in-flight leases, and write the winner's — atomically,
in one round trip. Redis Cluster runs a script against one slot only, so all
state a decision touches shares the domain's tag; a domain's scheduling load
lands on one shard, which at LLM request rates (tens to hundreds of
admissions/s per engine) is far below one shard's capacity. Tenant config,
which no decision reads, is tagged by tenant.

Scripts run by EVALSHA; on NOSCRIPT (SCRIPT FLUSH, a restarted or failed-over
Redis) the script is sent once with EVAL, which also caches it again.

Connection URLs: redis://, rediss:// (TLS), unix://, redis+sentinel://
[user:pass@]host:port[,host:port...]/service[/db] and redis+cluster://host:port.
The tests exercise standalone Redis and a 3-master Redis Cluster.

Failures: every client gets the same timeouts (`timeout_s` to connect and per
call) and one retry, after a short backoff, of a call that failed with a
connection error — the pooled connections to a restarted server each fail
once when next used, and that must not count as an outage. Anything else
redis-py raises (timeouts, CLUSTERDOWN, TRYAGAIN, a script error, a protocol
error) becomes `StoreUnavailable`: a store failure for the dispatcher to
handle, never an exception escaping into the pump or a request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import NoScriptError

from scheduler import rules
from scheduler.errors import StoreUnavailable
from scheduler.quotas import BucketLimits
from scheduler.redis_io import UNAVAILABLE, Script, connect, text
from scheduler.state.redis_scripts import RESERVE, SNAPSHOT, STEP
from scheduler.state.store import (
    NO_LIMIT,
    FleetSeen,
    SeenLevel,
    Step,
    StepOutcome,
    StoreSnapshot,
    tenant_fields,
)
from scheduler.tenancy.tenants import TenantConfig

_STEP, _RESERVE, _SNAPSHOT = Script.of(STEP), Script.of(RESERVE), Script.of(SNAPSHOT)
# STEP's isolation argument (lua_step_upkeep.py: `preempt`, `lend_slots`).
_ISOLATION_ARG = {
    rules.Isolation.RESERVE: "0",
    rules.Isolation.PREEMPT: "1",
    rules.Isolation.RESERVE_SLOTS: "2",
}


def seen_levels(row: list[Any], now_ms: float) -> dict[str, SeenLevel]:
    """One bucket hash's (rl, rts, tl, tts) as levels by kind, aged to `now_ms`; a
    kind never written (a full bucket) is absent."""
    rl, rts, tl, tts = row
    return {
        kind: SeenLevel(float(text(lvl)), max(0.0, (now_ms - float(text(ts))) / 1000))
        for kind, lvl, ts in (("r", rl, rts), ("t", tl, tts))
        if lvl is not None and ts is not None
    }


def _num(x: float | None) -> str:
    return repr(NO_LIMIT if x is None else float(x))


def _limits(b: BucketLimits) -> list[str]:
    return [
        _num(b.requests_per_s),
        _num(b.requests_burst),
        _num(b.tokens_per_s),
        _num(b.tokens_burst),
    ]


class RedisStore:
    kind = "redis"

    def __init__(
        self,
        client: Any,
        *,
        domain: str = "default",
        prefix: str = "fg",
        lease_ttl_s: float = 10.0,
        backlog_ttl_s: float = 3.0,
        done_ttl_s: float = 600.0,
    ) -> None:
        if any(c in domain for c in "{}") or any(c in prefix for c in "{}"):
            raise ValueError("the Redis domain and prefix may not contain braces")
        self._r = client
        self.prefix = prefix
        self.domain = domain
        self.base = f"{prefix}:{{{domain}}}"
        self.lease_ttl_ms = lease_ttl_s * 1000
        self.backlog_ttl_ms = backlog_ttl_s * 1000
        self.done_ttl_ms = done_ttl_s * 1000
        self.round_trips = 0
        self.noscript_reloads = 0

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 1.0, **kwargs: Any) -> RedisStore:
        return cls(connect(url, timeout_s=timeout_s), **kwargs)

    def _keys(self, tenants: set[str]) -> list[str]:
        fixed = ["vtc", "floor", "bl", "ls", "lt", "lk", "in", "done", "epoch", "w"]
        fixed += ["la", "adm", "rc", "blq"]
        return [f"{self.base}:{k}" for k in fixed] + [f"{self.base}:b:{t}" for t in sorted(tenants)]

    async def _eval(self, script: Script, keys: list[str], args: list[str]) -> Any:
        self.round_trips += 1
        try:
            try:
                return await self._r.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # SCRIPT FLUSH or a fresh server: send the source once (EVAL caches it).
                self.noscript_reloads += 1
                self.round_trips += 1
                return await self._r.eval(script.source, len(keys), *keys, *args)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    async def step(self, replica_id: str, step: Step) -> StepOutcome:
        args = [
            self.base,
            replica_id,
            repr(self.lease_ttl_ms),
            repr(self.backlog_ttl_ms),
            repr(self.done_ttl_ms),
            str(step.limits.max_requests),
            str(step.limits.max_kv_tokens),
            repr(step.w_in),
            repr(float(step.reserve_fraction)),
            repr(float(step.reserve_window_s)),
            repr(float(step.light_credit)),
            _ISOLATION_ARG[step.isolation],
            "-1" if math.isinf(step.allowance) else repr(float(step.allowance)),
            repr(float(step.w_cached)),
            str(step.unsent),
        ]
        tenants: set[str] = set()
        args.append(str(len(step.settlements)))
        for s in step.settlements:
            tenants.add(s.tenant_id)
            args += [s.lease_id, s.tenant_id, repr(s.refund_requests), repr(s.refund_tokens)]
            args += _limits(s.buckets)
        args.append(str(len(step.charges)))
        for tenant, delta in step.charges.items():
            args += [tenant, repr(delta)]
        args.append(str(len(step.forget)))
        for tenant, limits in step.forget.items():
            tenants.add(tenant)
            args += [tenant, *_limits(limits)]
        args.append(str(len(step.withdraw)))
        args += step.withdraw
        backlogged = step.backlogged or []
        args.append(str(len(backlogged)))
        args += backlogged
        args.append(str(len(step.queued)))
        for tenant, n in step.queued.items():
            args += [tenant, str(n)]
        args.append(str(len(step.announce)))
        args += step.announce
        renew = step.renew or []
        args.append(str(len(renew)))
        for lease in renew:
            args += [lease.lease_id, lease.tenant_id, str(lease.kv_tokens)]
        args.append(str(len(step.weights)))
        for tenant, weight in step.weights.items():
            args += [tenant, repr(float(weight))]
        args.append(str(len(step.candidates)))
        for c in step.candidates:
            tenants.add(c.tenant_id)
            args += [c.lease_id, c.tenant_id, repr(float(c.weight)), str(c.prompt_tokens)]
            args += [str(c.kv_tokens), "1" if c.take_buckets else "0", *_limits(c.buckets)]
            args += [_num(c.max_concurrent), str(c.queued), str(c.seq)]
            args += [str(c.cached), str(c.held_anywhere)]
        raw = await self._eval(_STEP, self._keys(tenants), args)
        admitted, full, blocked, flat, settled, state_lost, n, held, lent, turn, light = raw
        out = StepOutcome(
            admitted=[int(text(x)) for x in admitted],
            full=bool(int(full)),
            settled=int(settled),
            state_lost=bool(int(state_lost)),
            in_flight=int(n),
            held=[int(text(x)) for x in held],
            lent=[int(text(x)) for x in lent],
            light=[int(text(x)) for x in light],
            turn=bool(int(turn)),
        )
        for k in range(0, len(blocked), 2):
            w = float(text(blocked[k + 1]))
            out.blocked[int(text(blocked[k]))] = math.inf if w < 0 else w / 1000
        for k in range(0, len(flat), 2):
            out.counters[text(flat[k])] = float(text(flat[k + 1]))
        return out

    async def reserve(
        self, lease_id: str, tenant_id: str, tokens: int, buckets: BucketLimits
    ) -> tuple[str, float]:
        args = [self.base, tenant_id, str(tokens), *_limits(buckets)]
        limit, wait = await self._eval(_RESERVE, self._keys({tenant_id})[-1:], args)
        w = float(text(wait))
        return text(limit), (math.inf if w < 0 else w / 1000)

    def _tenant_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:{{t:{tenant_id}}}:cfg"

    async def put_tenant(self, cfg: TenantConfig) -> None:
        key = self._tenant_key(cfg.tenant_id)
        try:
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=tenant_fields(cfg))
                await pipe.execute()
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    async def snapshot(self) -> StoreSnapshot:
        inflight, vtc, leases, bl = await self._eval(_SNAPSHOT, self._keys(set()), [self.base])
        fields = {text(inflight[k]): int(text(inflight[k + 1])) for k in range(0, len(inflight), 2)}
        backlog: dict[str, set[str]] = {}
        for m in bl:
            replica, _, tenant = text(m).partition("\0")
            backlog.setdefault(tenant, set()).add(replica)
        levels: dict[str, tuple[float | None, float | None]] = {}
        ages: dict[str, tuple[float | None, float | None]] = {}

        def age_s(ts_ms: bytes | str | None, now_ms: float) -> float | None:
            return None if ts_ms is None else max(0.0, (now_ms - float(text(ts_ms))) / 1000)

        try:
            sec, usec = await self._r.time()
            now_ms = sec * 1000 + usec / 1000  # the scripts' clock (Redis TIME, ms)
            async for key in self._r.scan_iter(match=f"{self.base}:b:*"):
                r, t, r_ts, t_ts = await self._r.hmget(key, "rl", "tl", "rts", "tts")
                tenant = text(key)[len(self.base) + 3 :]
                levels[tenant] = (
                    None if r is None else float(text(r)),
                    None if t is None else float(text(t)),
                )
                ages[tenant] = (age_s(r_ts, now_ms), age_s(t_ts, now_ms))
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        return StoreSnapshot(
            in_flight=fields.get("n", 0),
            in_flight_kv_tokens=fields.get("kv", 0),
            concurrency={k[2:]: v for k, v in fields.items() if k.startswith("c:") and v},
            counters={text(vtc[k]): float(text(vtc[k + 1])) for k in range(0, len(vtc), 2)},
            leases={text(x) for x in leases},
            backlog=backlog,
            bucket_levels=levels,
            bucket_ages_s=ages,
        )

    async def observe(
        self, replica_id: str, ttl_s: float, tenants: Iterable[str], usage: bytes = b""
    ) -> FleetSeen:
        """Renew this replica's heartbeat, count the live replicas, read `tenants`'
        bucket levels, publish `usage`: one pipelined round trip, off the decision path."""
        key = f"{self.base}:rep"
        names = sorted(tenants)
        # The wall clock (NTP-close to Redis's, whose TIME the scripts use): a cluster
        # pipeline cannot carry a keyless TIME.
        now = time.time()
        try:
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {replica_id: now + ttl_s})
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.zcard(key)
                pipe.pexpire(key, max(1, int(ttl_s * 1000)))
                for t in names:
                    pipe.hmget(f"{self.base}:b:{t}", "rl", "rts", "tl", "tts")
                if usage:
                    pipe.hset(f"{self.base}:use", replica_id, usage)
                    # The hash outlives every replica's heartbeat by at most one TTL.
                    pipe.pexpire(f"{self.base}:use", max(1, int(ttl_s * 1000)))
                res = await pipe.execute()
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        levels: dict[tuple[str, str], SeenLevel] = {}
        for t, row in zip(names, res[4 : 4 + len(names)], strict=True):
            for kind, seen in seen_levels(row, now * 1000).items():
                levels[(t, kind)] = seen
        return FleetSeen(int(res[2]), levels)

    async def bucket_levels(self, tenant_id: str) -> dict[str, SeenLevel]:
        """One tenant's buckets as stored now: one HMGET (aged by the wall clock,
        as in `observe`)."""
        try:
            row = await self._r.hmget(f"{self.base}:b:{tenant_id}", "rl", "rts", "tl", "tts")
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        return seen_levels(row, time.time() * 1000)

    async def fleet_usage(self) -> dict[str, bytes]:
        """The live replicas' published usage (one round trip); drops the dead ones'."""
        try:
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.zrangebyscore(f"{self.base}:rep", time.time(), "+inf")
                pipe.hgetall(f"{self.base}:use")
                live, published = await pipe.execute()
            alive = {text(r) for r in live}
            usage = {text(r): text(v).encode() for r, v in published.items()}
            if dead := [r for r in usage if r not in alive]:
                await self._r.hdel(f"{self.base}:use", *dead)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        return {r: v for r, v in usage.items() if r in alive}

    async def ping(self) -> None:
        try:
            await self._r.ping()
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    async def aclose(self) -> None:
        await self._r.aclose()
