"""Budgets (scheduler/tenancy/budgets.py): calendar windows, what a budget counts,
when it binds, and bad input listed whole by the one tenant validator."""

from __future__ import annotations

import calendar
import datetime as dt

import pytest

from scheduler.tenancy.budgets import (
    ALL_KINDS,
    Budget,
    Spend,
    budget_of,
    budget_to_dict,
    judge,
    window,
)
from scheduler.tenancy.tenant_check import check_tenant, read_tenant


def _ts(*args: int, offset_min: int = 0) -> float:
    tz = dt.timezone(dt.timedelta(minutes=offset_min))
    return dt.datetime(*args, tzinfo=tz).timestamp()  # type: ignore[misc]


def test_day_and_month_windows_in_utc() -> None:
    now = _ts(2026, 12, 4, 21, 30)
    day = window("day", now)
    assert (day.label, day.start_s, day.end_s) == (
        "2026-12-04",
        _ts(2026, 12, 4),
        _ts(2026, 12, 5),
    )
    month = window("month", now)
    assert (month.label, month.start_s, month.end_s) == (
        "2026-12",
        _ts(2026, 12, 1),
        _ts(2027, 1, 1),
    )
    # A leap February: 29 days.
    feb = window("month", _ts(2028, 2, 10))
    assert feb.end_s - feb.start_s == 29 * 86_400
    assert calendar.isleap(2028)
    # The last second of a window is in it; its end is the next one's start.
    assert window("day", day.end_s - 1).label == "2026-12-04"
    assert window("day", day.end_s).label == "2026-12-05"


def test_an_offset_moves_the_boundaries_to_local_midnight() -> None:
    # 21:30 UTC on the 4th is 06:30 on the 5th at UTC+9.
    win = window("day", _ts(2026, 12, 4, 21, 30), utc_offset_min=9 * 60)
    assert win.label == "2026-12-05"
    assert win.start_s == _ts(2026, 12, 5, offset_min=9 * 60)
    assert win.end_s - win.start_s == 86_400


def test_token_kinds_partition_the_tokens() -> None:
    s = Spend(prompt=100, cached=30, completion=20, requests=2)
    assert s.tokens() == 120  # every token once: 70 computed + 30 cached + 20 out
    assert s.tokens(frozenset({"prompt"})) == 70
    assert s.tokens(frozenset({"prompt", "completion"})) == 90
    assert s.tokens(frozenset({"cached"})) == 30


def test_a_budget_binds_at_its_limit_and_warns_at_warn_at() -> None:
    win = window("day", _ts(2026, 12, 4))
    b = Budget("day", tokens=100, requests=10, warn_at=0.5)
    below = judge(b, Spend(prompt=40, completion=9, requests=1), win)
    assert (below.exhausted, below.warning, below.fraction) == (None, False, 0.49)
    warned = judge(b, Spend(prompt=40, completion=10, requests=1), win)
    assert (warned.exhausted, warned.warning) == (None, True)
    # Requests bind on their own, tokens on theirs; the larger fraction is reported.
    assert judge(b, Spend(requests=10), win).exhausted == "requests"
    spent = judge(b, Spend(prompt=100, requests=3), win)
    assert (spent.exhausted, spent.fraction) == ("tokens", 1.0)
    # Uncounted kinds do not bind.
    only_out = Budget("day", tokens=100, counts=frozenset({"completion"}))
    assert judge(only_out, Spend(prompt=10_000, completion=99), win).exhausted is None


def test_the_stored_form_reads_back() -> None:
    for b in (
        Budget("day", tokens=5),
        Budget("month", requests=7, counts=frozenset({"prompt", "cached"}), warn_at=0.9),
    ):
        assert budget_of(budget_to_dict(b)) == b
    assert budget_to_dict(Budget("day", tokens=5)) == {"period": "day", "tokens": 5}
    assert Budget("day", tokens=1).counts == ALL_KINDS


def test_every_problem_is_listed_at_once() -> None:
    cfg, problems = check_tenant(
        {
            "id": "acme",
            "budgets": [
                {"period": "week", "tokens": -5, "warn_at": 1.5},
                {"period": "day", "counts": ["prompt", "images"]},
                {"period": "month", "requests": "many", "colour": "red"},
                {"period": "day", "requests": 0},
            ],
        }
    )
    assert cfg is None
    fields = sorted(f for f, _ in problems)
    assert fields == [
        "budgets",  # two day budgets
        "budgets[0].period",
        "budgets[0].tokens",
        "budgets[0].warn_at",
        "budgets[1].counts",
        "budgets[1].tokens",  # neither tokens nor requests
        "budgets[2].colour",
        "budgets[2].requests",
        "budgets[3].requests",
    ]
    text = dict(problems)
    assert "week" in text["budgets[0].period"] and "day" in text["budgets[0].period"]
    assert "-5" in text["budgets[0].tokens"]
    assert "(0, 1]" in text["budgets[0].warn_at"]
    assert "images" in text["budgets[1].counts"]


@pytest.mark.parametrize("warn_at", [0, -0.1, 1.01, float("nan")])
def test_warn_at_must_be_a_fraction(warn_at: float) -> None:
    _, problems = read_tenant(
        {"id": "a", "budgets": [{"period": "day", "tokens": 1, "warn_at": warn_at}]}
    )
    assert [f for f, _ in problems] == ["budgets[0].warn_at"]


def test_flags_read_as_text() -> None:
    values, problems = read_tenant(
        {
            "id": "a",
            "budgets": [
                {"period": "month", "tokens": "1000", "warn_at": "0.9", "counts": ["cached"]}
            ],
        },
        text=True,
        partial=True,
    )
    assert problems == []
    assert values["budgets"] == (
        Budget("month", tokens=1000, counts=frozenset({"cached"}), warn_at=0.9),
    )
