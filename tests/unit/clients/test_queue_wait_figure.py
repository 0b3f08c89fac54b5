"""The light tenant's queue wait beside its TTFT (`bench fleet`): the part of a
first token spent in fairgate's queue, censored at the window's end for a request
never admitted, so a run says whether the light tenant waited on admission or
the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from fairgate.bench.fairness_analysis import analyse
from fairgate.bench.fairness_metrics import RequestRecord


@dataclass
class _Scenario:
    weights: dict[str, float] = field(default_factory=lambda: {"heavy": 1.0, "light": 1.0})
    victim: str = "light"


def _rec(
    tenant: str, sent_s: float, admitted_s: float | None, first_s: float | None
) -> RequestRecord:
    return RequestRecord(tenant, sent_s, 10, 1, admitted_s=admitted_s, first_token_s=first_s)


def test_the_queue_wait_p99_is_the_admission_part_censored_only_if_never_admitted() -> None:
    records = [
        _rec("light", 0.0, 0.01, 0.05),
        _rec("light", 1.0, 1.02, 1.30),  # waited on the engine, not the queue
        _rec("heavy", 0.0, 0.0, 0.10),
        _rec("heavy", 1.0, None, None),  # never admitted in the window: 9 s, censored
        # Still streaming at the window's end: admitted, its wait unknown (the
        # server says it at the end), so left out rather than censored.
        _rec("light", 9.9, None, 9.95),
    ]
    res = analyse(_Scenario(), records, 10.0, 1.0, "x", 1)
    light, heavy = res.per_tenant["light"], res.per_tenant["heavy"]
    assert light["queue_wait_p99_s"] == pytest.approx(0.02, abs=1e-3)
    assert light["ttft_p99_s"] == pytest.approx(0.30, abs=3e-3)
    assert heavy["queue_wait_p99_s"] == pytest.approx(9.0, abs=0.1)


def test_jain_over_queue_wait_weighs_the_other_tenants_mean_waits() -> None:
    from fairgate.bench.fairness_metrics import jain_of_waits
    from fairgate.bench.fleet_report import jain_wait

    assert jain_of_waits([0.0, 0.0]) == 1.0  # nobody waited: equal
    assert jain_of_waits([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain_of_waits([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    sc = _Scenario(weights={"a": 1.0, "b": 1.0, "light": 1.0})
    records = [
        _rec("a", 0.0, 0.0, 0.1),
        _rec("a", 1.0, 1.0, 1.1),
        _rec("b", 0.0, 0.3, 0.4),
        _rec("b", 1.0, 1.1, 1.2),  # b waits 0.2 s on average, a never
        _rec("light", 0.0, 5.0, 5.1),  # the light tenant is not among them
    ]
    res = analyse(sc, records, 10.0, 1.0, "x", 1)
    assert res.per_tenant["b"]["queue_wait_mean_s"] == pytest.approx(0.2)
    assert jain_wait(res.per_tenant, "light") == pytest.approx(0.5)
