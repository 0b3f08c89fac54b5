"""The one tenant validator (scheduler/tenancy/tenant_check.py): every problem at once."""

from __future__ import annotations

from scheduler.request import Priority
from scheduler.tenancy.tenant_check import check_tenant, read_tenant


def test_a_whole_tenant_with_every_kind_of_problem() -> None:
    cfg, problems = check_tenant(
        {
            "id": "a",
            "weight": 0,
            "colour": "red",
            "priorities": ["urgent"],
            "enabled": "yes",
            "over_quota": "later",
            "quotas": {"max_queued": 2.5, "tokens_burst": 5, "nope": 1, "requests_per_s": 0},
        }
    )
    assert cfg is None
    assert sorted(field for field, _ in problems) == [
        "colour",
        "enabled",
        "over_quota",
        "priorities",
        "quotas.max_queued",
        "quotas.nope",
        "quotas.requests_per_s",
        "quotas.tokens_burst",
        "weight",
    ]


def test_a_valid_tenant_becomes_its_config() -> None:
    cfg, problems = check_tenant(
        {"id": "a", "weight": 2, "priorities": ["batch"], "quotas": {"max_queued": 3}}
    )
    assert problems == [] and cfg is not None
    assert (cfg.weight, cfg.priorities, cfg.quotas.max_queued) == (2.0, {Priority.BATCH}, 3)


def test_flags_as_text_and_a_partial_update() -> None:
    values, problems = read_tenant(
        {"id": "a", "weight": 0.0, "quotas": {"max_queued": "abc", "requests_per_s": "2.5"}},
        text=True,
        partial=True,
    )
    assert [f for f, _ in problems] == ["quotas.max_queued", "weight"]
    assert values["quotas"] == {"requests_per_s": 2.5}
    # "none" clears a limit; a burst alone is fine in an update (the rate is the
    # server's), not in a whole tenant.
    values, problems = read_tenant(
        {"id": "a", "quotas": {"max_queued": "none", "tokens_burst": "9"}}, text=True, partial=True
    )
    assert problems == [] and values["quotas"] == {"max_queued": None, "tokens_burst": 9.0}
    _, problems = read_tenant({"id": "a", "quotas": {"tokens_burst": "9"}}, text=True)
    assert problems == [("quotas.tokens_burst", "tokens_burst needs tokens_per_min")]
    # Without `text`, a number written as text is a mistake (a YAML file's "5").
    _, problems = read_tenant({"id": "a", "weight": "5"})
    assert [f for f, _ in problems] == ["weight"]
