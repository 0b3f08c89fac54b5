"""Replicas' routes through a real Redis stream (service/engines/prefix_share.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduler.redis_io import connect
from service.engines.prefix_share import PrefixShare
from tests.helpers import eventually


def _share(url: str, replica: str, learned: list[tuple[str, int]], **kw: int) -> PrefixShare:
    return PrefixShare(
        connect(url, timeout_s=0.5),
        "t:{d}:routes",
        replica,
        lambda u, k: learned.append((u, k)),
        **kw,
    )


def _listener(url: str, **learn: Any) -> PrefixShare:
    """Replica "b", hearing only what `learn` names (learn_prefill, learn_load, ...)."""
    return PrefixShare(connect(url, timeout_s=0.5), "t:{d}:routes", "b", lambda u, k: None, **learn)


async def test_each_replica_learns_the_others_routes_not_its_own(redis_url: str) -> None:
    heard_a: list[tuple[str, int]] = []
    heard_b: list[tuple[str, int]] = []
    a, b = _share(redis_url, "a", heard_a), _share(redis_url, "b", heard_b, batch=2)
    try:
        a.publish("http://w0", -(2**63))
        a.publish("http://w1", 2**63 - 1)
        b.publish("http://w0", 7)
        await a.sync()
        await b.sync()
        await a.sync()
        # b reads in batches of 2 and goes on until the stream is read.
        assert heard_b == [("http://w0", -(2**63)), ("http://w1", 2**63 - 1)]
        assert heard_a == [("http://w0", 7)]
        # A replica that starts later reads what is still in the stream.
        late: list[tuple[str, int]] = []
        c = _share(redis_url, "c", late)
        await c.sync()
        assert len(late) == 3
        await c.aclose()
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_down_costs_locality_only(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing raises out of the share's loop, what waits to be sent stays bounded,
    and the outage is logged once."""
    heard: list[tuple[str, int]] = []
    share = _share("redis://127.0.0.1:1", "a", heard, batch=100)
    for k in range(1000):
        share.publish("http://w0", k)
    assert len(share._out) == 100
    with caplog.at_level(logging.WARNING, logger="service.engines.prefix_share"):
        await share.start()
        for n in range(1, 4):
            share.publish("http://w0", 1)
            await eventually(lambda n=n: share.rounds >= n, what=f"round {n}")
    await share.aclose()
    assert heard == []
    warnings = [r for r in caplog.records if "Redis failed" in r.message]
    assert len(warnings) == 1


async def test_prefills_reach_the_other_replica_and_end_there(redis_url: str) -> None:
    """A prefill one replica announces reaches the other, named by its replica,
    and so does its end; a replica never hears its own."""
    ended: list[tuple[str, str, int]] = []
    heard: list[tuple[str, str, int]] = []
    a = _share(redis_url, "a", [])
    b = _listener(redis_url, learn_prefill=lambda u, pid, n: heard.append((u, pid, n)))
    a.learn_prefill = lambda u, pid, n: ended.append((u, pid, n))
    try:
        a.publish_prefill("http://w1", "7", 3000)
        a.publish("http://w1", 42)  # routes and prefills share the stream
        await a.sync()
        await b.sync()
        assert heard == [("http://w1", "a:7", 3000)]
        a.publish_prefill("http://w1", "7", 0)
        await a.sync()
        await b.sync()
        await a.sync()
        assert heard[-1] == ("http://w1", "a:7", 0) and ended == []
        # Entries another writer left malformed are skipped, the share goes on.
        await b.client.xadd("t:{d}:routes", {"u": "http://w1", "p": "9", "n": "x"})
        await b.client.xadd("t:{d}:routes", {"u": "http://w1", "p": "8", "n": "5"})
        await b.sync()
        assert heard[-1] == ("http://w1", ":8", 5)
    finally:
        await a.aclose()
        await b.aclose()


async def test_loads_reach_the_other_replica_when_they_change_and_each_refresh(
    redis_url: str,
) -> None:
    """A replica's in-flight count per worker reaches the other as its latest value
    only (one entry per worker and round), and again every refresh unchanged."""
    heard: list[tuple[str, str, int, int, int]] = []
    a = _share(redis_url, "a", [])
    a.load_refresh_s = 3600.0  # no refresh but the first, until set below
    b = _listener(redis_url, learn_load=lambda u, r, n, kv, q: heard.append((u, r, n, kv, q)))
    try:
        a.publish_load("http://w1", 1, 100)
        a.publish_load("http://w1", 2, 250)  # the same round: only the latest goes
        a.publish_load("http://w0", 1, 40, 30)  # with 30 tokens of quiet prefill
        await a.sync()
        await b.sync()
        assert sorted(heard) == [("http://w0", "a", 1, 40, 30), ("http://w1", "a", 2, 250, 0)]
        sent = a.sent_total
        await a.sync()  # nothing changed, no refresh due: nothing sent
        assert a.sent_total == sent
        a.load_refresh_s = 0.0
        await a.sync()  # a refresh repeats every worker's load
        await b.sync()
        assert a.sent_total == sent + 2
        assert sorted(heard[2:]) == [("http://w0", "a", 1, 40, 30), ("http://w1", "a", 2, 250, 0)]
        await b.client.xadd("t:{d}:routes", {"u": "http://w1", "l": "x", "v": "1", "r": "c"})
        await b.client.xadd("t:{d}:routes", {"u": "http://w1", "l": "0", "v": "0", "r": "c"})
        await b.sync()
        # The malformed one skipped; an older replica's, without "q": no quiet prefill.
        assert heard[-1] == ("http://w1", "c", 0, 0, 0)
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_light_request_placed_reaches_the_other_replica_once_a_round(
    redis_url: str,
) -> None:
    heard: list[str] = []
    a = _share(redis_url, "a", [])
    b = _listener(redis_url, learn_light=lambda: heard.append("light"))
    try:
        await a.sync()
        sent = a.sent_total
        a.publish_light()
        a.publish_light()
        await a.sync()
        assert a.sent_total == sent + 1
        await a.sync()  # none placed since: nothing sent
        await b.sync()
        assert heard == ["light"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_prefill_and_a_light_request_reach_a_running_replica_at_once(
    redis_url: str,
) -> None:
    """Started replicas: a prefill and a light request go out when placed and the
    other replica reads them as they come, not at its next round (`interval_s` is
    far beyond the wait here); a route waits for the sender's round."""
    prefills: list[tuple[str, str, int]] = []
    lights: list[int] = []
    routes: list[tuple[str, int]] = []

    def share(replica: str, **learn: Any) -> PrefixShare:
        return PrefixShare(
            connect(redis_url, timeout_s=0.5),
            "t:{d}:routes",
            replica,
            lambda u, k: routes.append((u, k)),
            interval_s=30.0,
            **learn,
        )

    a = share("a")
    b = share(
        "b",
        learn_prefill=lambda u, pid, n: prefills.append((u, pid, n)),
        learn_light=lambda: lights.append(1),
    )
    try:
        await a.start()
        await b.start()
        await eventually(lambda: a.rounds >= 1 and b.rounds >= 1, what="first rounds")
        a.publish("http://w0", 5)  # not urgent: waits for a's next round
        a.publish_prefill("http://w1", "1", 4000)
        await eventually(lambda: bool(prefills), what="the prefill at b")
        assert prefills == [("http://w1", "a:1", 4000)]
        # The route went in the same send, ahead of the prefill.
        assert routes == [("http://w0", 5)]
        a.publish_light()
        await eventually(lambda: bool(lights), what="the light request at b")
        a.publish_prefill("http://w1", "1", 0)
        await eventually(lambda: len(prefills) == 2, what="the prefill's end at b")
        assert prefills[-1] == ("http://w1", "a:1", 0) and lights == [1]
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_change_of_quiet_prefill_wakes_the_sender(redis_url: str) -> None:
    """A load whose quiet prefill changed is sent at once (a light request's step packs
    the short prompts waiting at its engine); requests and KV alone wait a round."""
    a = _share(redis_url, "a", [])
    try:
        a.publish_load("http://w0", 1, 40)
        assert not a._urgent.is_set()
        a.publish_load("http://w0", 2, 80, 50)
        assert a._urgent.is_set()
        a._urgent.clear()
        a.publish_load("http://w0", 3, 90, 50)  # the same prefill
        assert not a._urgent.is_set()
    finally:
        await a.aclose()
