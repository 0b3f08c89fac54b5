"""An API key's own limits: within its tenant's at issue, the tighter of the two after."""

from __future__ import annotations

import dataclasses

from scheduler.key_gate import effective_limits
from scheduler.request import Priority
from scheduler.tenancy.budgets import Budget
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas

TENANT = TenantConfig(
    "t",
    priorities=frozenset({Priority.BATCH}),
    quotas=TenantQuotas(
        requests_per_s=10.0, requests_burst=20.0, tokens_per_min=6000.0, max_concurrent=4
    ),
)


def test_within_the_tenant_is_accepted() -> None:
    ok = KeyLimits(
        TenantQuotas(requests_per_s=5.0, requests_burst=20.0, tokens_per_min=600.0),
        frozenset({Priority.BATCH}),
    )
    assert ok.problems(TENANT) == []
    # A tenant without a limit of that kind puts no ceiling on the key's.
    free = TenantConfig("u")
    assert KeyLimits(TenantQuotas(requests_per_s=1e6, max_concurrent=9)).problems(free) == []


def test_every_problem_is_listed() -> None:
    bad = KeyLimits(
        TenantQuotas(
            requests_per_s=11.0,  # above the tenant's 10
            requests_burst=21.0,  # above the tenant's burst of 20
            tokens_per_min=-1.0,  # out of range (and so not compared)
            tokens_burst=5.0,
            max_concurrent=5,  # above the tenant's 4
            max_queued=3,  # not a key limit
        ),
        frozenset({Priority.INTERACTIVE, Priority.BATCH}),
    )
    problems = dict(bad.problems(TENANT))
    assert set(problems) == {
        "quotas.requests_per_s",
        "quotas.requests_burst",
        "quotas.tokens_per_min",
        "quotas.max_concurrent",
        "quotas.max_queued",
        "priorities",
    }
    assert "above tenant 't'" in problems["quotas.requests_per_s"]
    assert "not a key limit" in problems["quotas.max_queued"]
    assert "interactive" in problems["priorities"]
    # Its own rules hold without a tenant too (the burst without a rate).
    alone = KeyLimits(TenantQuotas(requests_burst=3.0))
    assert [f for f, _ in alone.problems(None)] == ["quotas.requests_burst"]


def test_a_tenant_lowered_later_binds_the_key() -> None:
    key = KeyLimits(
        TenantQuotas(
            requests_per_s=5.0, requests_burst=20.0, tokens_per_min=600.0, max_concurrent=3
        ),
        frozenset({Priority.BATCH}),
    )
    lowered = dataclasses.replace(
        TENANT,
        priorities=frozenset({Priority.INTERACTIVE}),
        quotas=TenantQuotas(
            requests_per_s=2.0, requests_burst=4.0, tokens_per_min=60.0, max_concurrent=1
        ),
    )
    now = effective_limits(key, lowered)
    assert (now.buckets.requests_per_s, now.buckets.requests_burst) == (2.0, 4.0)
    assert now.buckets.tokens_per_s == 1.0  # 60 tokens/min
    assert now.buckets.tokens_burst == 60.0
    assert now.max_concurrent == 1
    assert now.priorities == frozenset()  # the key's only class is gone: nothing passes
    # Where the key is the tighter one, it stays.
    before = effective_limits(key, TENANT)
    assert (before.buckets.requests_per_s, before.buckets.tokens_per_s) == (5.0, 10.0)
    assert before.max_concurrent == 3
    # A kind the key does not limit is left to the tenant's own bucket.
    only_tokens = effective_limits(KeyLimits(TenantQuotas(tokens_per_min=600.0)), TENANT)
    assert only_tokens.buckets.requests_per_s is None
    assert only_tokens.priorities == TENANT.priorities


BUDGETED = TenantConfig(
    "b",
    budgets=(Budget("day", tokens=1000), Budget("month", tokens=20_000, requests=500)),
)


def test_a_key_budget_within_the_tenants_is_accepted() -> None:
    ok = KeyLimits(budgets=(Budget("day", tokens=1000, requests=7), Budget("month", requests=500)))
    # requests for the day: the tenant budgets none of the day's requests.
    assert ok.problems(BUDGETED) == []
    assert not ok.empty
    # A period the tenant does not budget: the key's is the only one.
    assert KeyLimits(budgets=(Budget("month", tokens=10**9),)).problems(TenantConfig("u")) == []


def test_every_key_budget_problem_is_listed() -> None:
    bad = KeyLimits(
        budgets=(
            Budget("day", tokens=1001),  # above the tenant's 1000 a day
            Budget("month", tokens=-5, requests=501),  # negative; above 500 requests
            Budget("week", tokens=1),  # no such period
            Budget("day", requests=3),  # a second day budget
        )
    )
    problems = bad.problems(BUDGETED)
    fields = [f for f, _ in problems]
    assert sorted(fields) == sorted(
        [
            "budgets[0].tokens",
            "budgets[1].tokens",
            "budgets[1].requests",
            "budgets[2].period",
            "budgets",
        ]
    )
    msgs = dict(problems)
    assert "1001 is above the day budget of tenant 'b' (1000 tokens)" in msgs["budgets[0].tokens"]
    assert "must be an integer" in msgs["budgets[1].tokens"]  # range, not compared
    assert "above the month budget of tenant 'b' (500 requests)" in msgs["budgets[1].requests"]
    # Its own rules hold without a tenant too.
    assert [f for f, _ in KeyLimits(budgets=(Budget("day"),)).problems(None)] == [
        "budgets[0].tokens"
    ]
