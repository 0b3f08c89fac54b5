"""The Redis client of the scheduler's stores: connection, scripts, failures.

Shared by the scheduling state (`state/redis_store.py`) and the tenant store
(`tenancy/redis_tenant_store.py`), so neither imports the other.

Failures: every client gets the same timeouts (`timeout_s` to connect and per
call) and one retry, after a short backoff, of a call that failed with a
connection error (the pooled connections to a restarted server each fail once
when next used, and that must not count as an outage).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

# Every failure of the client is a store failure (RedisClusterException: e.g. no
# node covers the slot; it is not a RedisError).
UNAVAILABLE = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)


def _retry_stale() -> Retry:
    """One retry of a connection error (a stale pooled connection), after 20-100 ms."""
    return Retry(ExponentialBackoff(cap=0.1, base=0.02), 1, (RedisConnectionError,))


@dataclass(frozen=True, slots=True)
class Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


def text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def connect(url: str, *, timeout_s: float = 1.0) -> Any:
    """A redis-py asyncio client for `url`: `timeout_s` per call and to connect, one retry
    of a connection error (see the module's docstring)."""
    opts: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": _retry_stale(),
    }
    parts = urlsplit(url)
    if parts.scheme == "redis+sentinel":
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] if len(netloc) == 2 else ""
        sentinels = []
        for hostport in netloc[-1].split(","):
            host, _, port = hostport.partition(":")
            sentinels.append((host, int(port or 26379)))
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError(f"{url!r}: redis+sentinel:// needs a service name: .../mymaster")
        user, _, password = auth.partition(":")
        # Typed from redis 8 on; untyped before.
        sentinel = Sentinel(sentinels, socket_timeout=timeout_s)  # type: ignore[no-untyped-call,unused-ignore]
        return sentinel.master_for(
            path[0],
            db=int(path[1]) if len(path) > 1 else 0,
            username=unquote(user) or None,
            password=unquote(password) or None,
            **opts,
        )
    if parts.scheme in ("redis+cluster", "rediss+cluster"):
        plain = url.replace("+cluster", "", 1)
        return RedisCluster.from_url(plain, **opts)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"{url!r}: use redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
        )
    return aioredis.Redis.from_url(url, **opts)
