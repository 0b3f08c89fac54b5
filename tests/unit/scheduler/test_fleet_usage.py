"""Per-replica usage as published in the store, and the fleet's sum."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.gate_stats import TenantStats
from scheduler.shared import fleet_usage


def stats(tid: str, **kw: Any) -> TenantStats:
    return TenantStats(tid, weight=2.0, virtual_counter=50.0, **kw)


def test_round_trip_keeps_what_a_replica_has_and_skips_idle_tenants() -> None:
    busy = stats(
        "a",
        queued=2,
        in_flight=3,
        charged_requests=4.0,
        charged_tokens=120.5,
        rejected_total=1,
        rejections={"max_queued": 1},
        finished_total=7,
    )
    out = fleet_usage.decode(fleet_usage.encode([busy, stats("idle")]))
    assert set(out) == {"a"}
    assert out["a"] == fleet_usage.ReplicaUsage(2, 3, 1, 7, 4.0, 120.5, {"max_queued": 1})


@pytest.mark.parametrize("blob", [b"", b"{", b"[1]", b'{"a": 3}', b'{"a": {"queued": "x"}}'])
def test_an_unreadable_blob_counts_as_empty(blob: bytes) -> None:
    assert fleet_usage.decode(blob) == {}


def test_the_fleet_sum_adds_requests_and_totals_not_counters_or_buckets() -> None:
    mine = stats("a", in_flight=1, rejections={"max_queued": 1}, rejected_total=1, paused=True)
    others = [
        fleet_usage.ReplicaUsage(queued=2, in_flight=3, charged_tokens=10.0),
        fleet_usage.ReplicaUsage(
            in_flight=1, finished_total=4, rejected_total=2, rejections={"max_queued": 1, "x": 1}
        ),
    ]
    fleet = fleet_usage.add(mine, others)
    assert (fleet.queued, fleet.in_flight, fleet.finished_total) == (2, 5, 4)
    assert fleet.charged_tokens == 10.0 and fleet.rejected_total == 3
    assert fleet.rejections == {"max_queued": 2, "x": 1}
    # The tenant's own: counter, weight, buckets, and this replica's pause.
    assert (fleet.virtual_counter, fleet.weight, fleet.paused) == (50.0, 2.0, True)
    assert fleet_usage.add(mine, []) is mine
