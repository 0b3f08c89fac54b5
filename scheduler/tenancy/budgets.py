"""Budgets: what a tenant (or one of its API keys) may spend per calendar window.

A budget caps tokens and/or requests over a calendar day or month (UTC, or UTC
plus a fixed offset). The spend is what the usage log recorded: each request
once, when its engine stream ended (service/usage_log.py), refusals counted
apart. A request is refused before it is queued when its subject's spend in
the current window has reached a budget; one admitted under budget may take
the spend past it by its own size (and by the others in flight at the time),
as OpenAI's usage limits do.

Token kinds partition a request's tokens: `prompt` (prompt tokens the engine
computed), `cached` (prompt tokens it had cached) and `completion`. A budget
counts the kinds it names (all three by default).

Pure: no clock of its own, no I/O; the service reads the counters and asks.
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")
TOKEN_KINDS = ("prompt", "cached", "completion")
ALL_KINDS = frozenset(TOKEN_KINDS)
# Inclusive ranges: a budget of 0 would refuse everything (disable the tenant for
# that); above 1e15 tokens a float loses units.
BUDGET_TOKENS_RANGE = (1, 10**15)
BUDGET_REQUESTS_RANGE = (1, 10**12)
DEFAULT_WARN_AT = 0.8
# A fixed offset from UTC for the windows' boundaries (whole minutes, ±14 h).
MAX_UTC_OFFSET_MIN = 14 * 60


@dataclass(frozen=True, slots=True)
class Budget:
    period: str
    tokens: int | None = None
    requests: int | None = None
    counts: frozenset[str] = ALL_KINDS  # token kinds the `tokens` limit counts
    warn_at: float = DEFAULT_WARN_AT  # fraction spent that raises the warning

    @property
    def name(self) -> str:
        """How refusals and reports name it: "budget.day", "budget.month"."""
        return f"budget.{self.period}"

    def problems(self) -> list[tuple[str, str]]:
        """(field, what to fix) for every invalid value (fields relative to the budget)."""
        out: list[tuple[str, str]] = []
        if self.period not in PERIODS:
            out.append(("period", f"expected one of {list(PERIODS)}, got {self.period!r}"))
        if self.tokens is None and self.requests is None:
            out.append(("tokens", "set tokens, requests or both"))
        for name, bounds in (("tokens", BUDGET_TOKENS_RANGE), ("requests", BUDGET_REQUESTS_RANGE)):
            value = getattr(self, name)
            lo, hi = bounds
            if value is not None and (isinstance(value, bool) or not lo <= value <= hi):
                out.append((name, f"must be an integer in [{lo}, {hi:.0e}] (got {value})"))
        unknown = sorted(self.counts - ALL_KINDS)
        if unknown:
            out.append(("counts", f"unknown token kinds {unknown} (known: {list(TOKEN_KINDS)})"))
        elif not self.counts:
            out.append(("counts", f"name at least one of {list(TOKEN_KINDS)}"))
        w = self.warn_at
        if isinstance(w, bool) or not math.isfinite(w) or not 0 < w <= 1:
            out.append(("warn_at", f"must be a fraction in (0, 1] (got {w})"))
        return out


@dataclass(frozen=True, slots=True)
class Window:
    """One calendar window: [start_s, end_s) in Unix seconds, and its label."""

    period: str
    label: str  # "2026-12-04" (day) or "2026-12" (month), in the offset's calendar
    start_s: float
    end_s: float


def window(period: str, now_s: float, utc_offset_min: int = 0) -> Window:
    """The `period` window holding `now_s`, with boundaries at local midnight."""
    tz = dt.timezone(dt.timedelta(minutes=utc_offset_min))
    local = dt.datetime.fromtimestamp(now_s, tz)
    if period == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + dt.timedelta(days=1)
        label = start.strftime("%Y-%m-%d")
    elif period == "month":
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        end = start + dt.timedelta(days=days)
        label = start.strftime("%Y-%m")
    else:
        raise ValueError(f"unknown period {period!r}")
    return Window(period, label, start.timestamp(), end.timestamp())


@dataclass(frozen=True, slots=True)
class Spend:
    """What a subject spent in one window (the usage log's counters)."""

    prompt: int = 0  # prompt tokens, cached ones included (as the usage record)
    cached: int = 0
    completion: int = 0
    requests: int = 0  # requests that reached the engine
    refusals: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)  # reason → refusals

    def tokens(self, counts: frozenset[str] = ALL_KINDS) -> int:
        kinds = {
            "prompt": self.prompt - self.cached,
            "cached": self.cached,
            "completion": self.completion,
        }
        return sum(v for k, v in kinds.items() if k in counts)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget against a spend: how much is used, and whether it binds."""

    budget: Budget
    window: Window
    tokens_used: int
    requests_used: int

    @property
    def fraction(self) -> float:
        """The larger of the fractions spent (tokens, requests)."""
        b = self.budget
        parts = [self.tokens_used / b.tokens] if b.tokens else []
        parts += [self.requests_used / b.requests] if b.requests else []
        return max(parts, default=0.0)

    @property
    def exhausted(self) -> str | None:
        """The limit that is spent ("tokens" or "requests"), or None."""
        b = self.budget
        if b.tokens is not None and self.tokens_used >= b.tokens:
            return "tokens"
        if b.requests is not None and self.requests_used >= b.requests:
            return "requests"
        return None

    @property
    def warning(self) -> bool:
        return self.fraction >= self.budget.warn_at


def judge(budget: Budget, spend: Spend, win: Window) -> BudgetState:
    return BudgetState(budget, win, spend.tokens(budget.counts), spend.requests)


def budget_problems(budgets: tuple[Budget, ...]) -> list[tuple[str, str]]:
    """Every problem of a list of budgets, as `budgets[i].<field>`."""
    out = [(f"budgets[{i}].{f}", m) for i, b in enumerate(budgets) for f, m in b.problems()]
    periods = [b.period for b in budgets]
    for p in sorted({p for p in periods if periods.count(p) > 1}):
        out.append(("budgets", f"more than one {p} budget: set tokens and requests in one"))
    return out


def budget_to_dict(b: Budget) -> dict[str, object]:
    """A budget as the tenants file writes it (defaults left out); the stores'
    JSON too. `Budget(**budget_from_dict(d))` reads it back."""
    out: dict[str, object] = {"period": b.period}
    if b.tokens is not None:
        out["tokens"] = b.tokens
    if b.requests is not None:
        out["requests"] = b.requests
    if b.counts != ALL_KINDS:
        out["counts"] = [k for k in TOKEN_KINDS if k in b.counts]
    if b.warn_at != DEFAULT_WARN_AT:
        out["warn_at"] = b.warn_at
    return out


def budget_of(d: Mapping[str, object]) -> Budget:
    """The inverse of `budget_to_dict` (for stored, already validated budgets)."""
    counts = d.get("counts")
    return Budget(
        period=str(d["period"]),
        tokens=int(d["tokens"]) if d.get("tokens") is not None else None,  # type: ignore[call-overload]
        requests=int(d["requests"]) if d.get("requests") is not None else None,  # type: ignore[call-overload]
        counts=frozenset(counts) if isinstance(counts, list) else ALL_KINDS,
        warn_at=float(d.get("warn_at", DEFAULT_WARN_AT)),  # type: ignore[arg-type]
    )
