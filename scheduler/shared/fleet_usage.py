"""Each replica's per-tenant usage, published in the store, summed for the fleet.

Counters and bucket levels live in the store, so every replica reports them
fleet-wide. Requests queued and in flight, and the totals of what ended or
was refused, are each replica's own. So that admin `GetUsage` on any replica
counts the whole fleet, every replica publishes its own numbers with its
heartbeat (`FleetObserver.observe`), and a reader adds the other live
replicas' last published numbers (at most one heartbeat old) to its own live
ones (`SharedStats.build(fleet=True)`). Totals count from each live replica's
start: a replica that is gone takes its totals with it. The telemetry gauges
stay per replica (a metrics backend sums the replicas itself).

The encoding is JSON, one object per tenant with anything to report; a blob
this version cannot read (another version's replica) counts as empty.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.gate_stats import TenantStats

# The per-replica fields of TenantStats: what the fleet's sum adds up.
_INTS = ("queued", "in_flight", "rejected_total", "finished_total")
_FLOATS = ("charged_requests", "charged_tokens")


@dataclass(frozen=True, slots=True)
class ReplicaUsage:
    """One tenant's numbers on one replica."""

    queued: int = 0
    in_flight: int = 0
    rejected_total: int = 0
    finished_total: int = 0
    charged_requests: float = 0.0
    charged_tokens: float = 0.0
    rejections: Mapping[str, int] = field(default_factory=dict)


def encode(tenants: Iterable[TenantStats]) -> bytes:
    """This replica's numbers, for tenants that have any."""
    out: dict[str, dict[str, object]] = {}
    for t in tenants:
        row: dict[str, object] = {k: getattr(t, k) for k in (*_INTS, *_FLOATS) if getattr(t, k)}
        if t.rejections:
            row["rejections"] = dict(t.rejections)
        if row:
            out[t.tenant_id] = row
    return json.dumps(out, separators=(",", ":")).encode()


def decode(blob: bytes) -> dict[str, ReplicaUsage]:
    """Another replica's numbers; {} for a blob this version cannot read."""
    try:
        raw = json.loads(blob)
        return {
            str(tid): ReplicaUsage(
                queued=int(row.get("queued", 0)),
                in_flight=int(row.get("in_flight", 0)),
                rejected_total=int(row.get("rejected_total", 0)),
                finished_total=int(row.get("finished_total", 0)),
                charged_requests=float(row.get("charged_requests", 0.0)),
                charged_tokens=float(row.get("charged_tokens", 0.0)),
                rejections={str(k): int(v) for k, v in row.get("rejections", {}).items()},
            )
            for tid, row in raw.items()
        }
    except (ValueError, TypeError, AttributeError):
        return {}


def add(mine: TenantStats, others: Iterable[ReplicaUsage]) -> TenantStats:
    """`mine` with the other replicas' numbers added."""
    others = list(others)
    if not others:
        return mine
    rejections = Counter(mine.rejections)
    for o in others:
        rejections.update(o.rejections)
    sums: dict[str, object] = {
        k: getattr(mine, k) + sum(getattr(o, k) for o in others) for k in (*_INTS, *_FLOATS)
    }
    return dataclasses.replace(mine, rejections=dict(rejections), **sums)  # type: ignore[arg-type]
