"""A real 3-master Redis Cluster started by the test (redis-server
--cluster-enabled, slots assigned with CLUSTER MEET / ADDSLOTS): the master
holding the domain's slot is killed (CLUSTERDOWN, refused connections) and
restarted; every replica fails over once — no dead pump, no UNAVAILABLE
forever — and comes back."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import pytest
import redis as redis_lib

from scheduler.budget import AdmissionLimits
from tests.helpers import eventually
from tests.integration.redis_fleet import DOMAIN, LIMIT, Fleet, assert_nothing_left
from tests.redis_server import RedisServer, find_redis_server, free_port

SLOTS = 16384


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too."""
    while True:
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port


def _cluster_ok(port: int) -> bool:
    r = redis_lib.Redis(port=port)
    try:
        info = r.execute_command("CLUSTER", "INFO")
    except redis_lib.RedisError:
        return False
    finally:
        r.close()
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def _wait(cond: object, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.05)


@pytest.fixture
def cluster() -> Iterator[list[RedisServer]]:
    binary = find_redis_server()
    assert binary is not None
    args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "500"]
    nodes = [RedisServer(binary, _cluster_port(), args) for _ in range(3)]
    try:
        for n in nodes:
            n.start()
        first = redis_lib.Redis(port=nodes[0].port)
        for n in nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
        first.close()
        for i, n in enumerate(nodes):
            r = redis_lib.Redis(port=n.port)
            r.execute_command("CLUSTER", "ADDSLOTS", *range(i * SLOTS // 3, (i + 1) * SLOTS // 3))
            r.close()
        _wait(lambda: all(_cluster_ok(n.port) for n in nodes), "the cluster forms")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


async def test_the_master_of_the_domain_killed_and_restarted(
    cluster: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="scheduler.shared.dispatcher")
    r = redis_lib.Redis(port=cluster[0].port)
    slot = int(r.execute_command("CLUSTER", "KEYSLOT", f"fg:{{{DOMAIN}}}:vtc"))
    r.close()
    holder = cluster[slot * 3 // SLOTS]
    other = next(n for n in cluster if n is not holder)
    fleet = Fleet(f"redis+cluster://127.0.0.1:{other.port}", 2, AdmissionLimits(LIMIT, 10_000))
    await fleet.start()
    try:
        fleet.load(per_replica=3)
        await eventually(lambda: fleet.record.count("done") >= 20, what="load runs")
        holder.kill()
        await eventually(lambda: fleet.modes() == ["open"] * 2, what="every replica fails open")
        done = fleet.record.count("done")
        await eventually(lambda: fleet.record.count("done") >= done + 10, what="fail-open admits")
        holder.start()  # same port and nodes.conf: it takes its slots back (empty)
        await asyncio.to_thread(_wait, lambda: _cluster_ok(holder.port), "the cluster heals")
        await eventually(lambda: fleet.modes() == ["ok"] * 2, timeout_s=15, what="back")
        back_s = time.monotonic()
        done = fleet.record.count("done")
        await eventually(lambda: fleet.record.count("done") >= done + 20, what="load runs again")
        await fleet.stop_load()
        print(
            f"\ncluster master kill: transitions per replica {fleet.transitions()}, "
            f"engine peak {fleet.engine.peak}/{LIMIT}, "
            f"pump restarts {[d.state.pump_restarts_total for d in fleet.replicas]}"
        )
        assert [d.state.pump_restarts_total for d in fleet.replicas] == [0, 0]
        assert not caplog.records  # no ERROR: nothing escaped
        assert all(t >= 2 and t % 2 == 0 for t in fleet.transitions())
        assert fleet.record.count("unavailable") == 0
        assert fleet.record.count("done", after_s=back_s) >= 20
        assert fleet.engine.peak <= LIMIT
        await assert_nothing_left(fleet)
    finally:
        await fleet.aclose()
