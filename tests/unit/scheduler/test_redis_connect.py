"""Every kind of Redis client gets the same timeouts and the one retry of a
connection error (scheduler/state/redis_store.py `connect`); the clients are built,
not connected."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.redis_io import connect


def _kwargs(client: Any) -> dict[str, Any]:
    if isinstance(client, RedisCluster):
        return dict(client.nodes_manager.connection_kwargs)
    return dict(client.connection_pool.connection_kwargs)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0",
        "unix:///tmp/fairgate-none.sock",
        "redis+cluster://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/mymaster/0",
    ],
)
async def test_every_client_gets_the_timeouts_and_one_retry(url: str) -> None:
    client = connect(url, timeout_s=0.25)
    try:
        kw = _kwargs(client)
        assert kw["socket_timeout"] == 0.25 and kw["socket_connect_timeout"] == 0.25
        retry = kw.get("retry") or client.retry
        assert retry.get_retries() == 1
        # Connection errors (a stale pooled connection) are retried; timeouts are not.
        assert RedisConnectionError in retry._supported_errors
        assert RedisTimeoutError not in retry._supported_errors
    finally:
        await client.aclose()
