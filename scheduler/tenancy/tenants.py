"""Tenants: their fair-share weight, allowed classes, quotas, and the registry.

A tenant is who pays for a request (resolved from the API key, never from a
client-supplied field). The registry maps a tenant id to its config; requests
without a tenant go to the default tenant, or are refused when there is none.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

from scheduler.errors import (
    PriorityNotAllowed,
    TenantDisabled,
    TenantRequired,
    UnknownTenant,
)
from scheduler.request import Priority
from scheduler.tenancy.budgets import Budget, budget_problems

OverQuotaMode = Literal["reject", "wait"]
OVER_QUOTA_MODES: tuple[OverQuotaMode, ...] = ("reject", "wait")
ALL_PRIORITIES = frozenset(Priority)


# Tenant ids travel in metadata, metric labels, Redis keys and logs: keep them short
# and plain. The one rule for every entry point (admin API, tenants file, headers).
MAX_TENANT_ID_CHARS = 63
TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_TENANT_ID_RE = re.compile(TENANT_ID_PATTERN)


def tenant_id_problem(tenant_id: str) -> str | None:
    """What is wrong with a tenant id, or None when it is valid."""
    if not tenant_id:
        return "a tenant id is required"
    if len(tenant_id) > MAX_TENANT_ID_CHARS:
        return f"at most {MAX_TENANT_ID_CHARS} characters (got {len(tenant_id)}); use a shorter id"
    if not _TENANT_ID_RE.match(tenant_id):
        return (
            f"{tenant_id[:MAX_TENANT_ID_CHARS]!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return None


# Sane, finite ranges for every weight and quota (inclusive). Values outside them
# pass a "> 0" check but break arithmetic later: 1e-300 requests/s overflows a retry
# delay, a weight of 5e-324 makes VTC counters infinite, inf never refills. Bounds
# are generous (one request per ~12 days up to a million per second).
WEIGHT_RANGE = (1e-3, 1e3)


def range_problem(name: str, value: float, bounds: tuple[float, float]) -> str | None:
    """None when `value` is finite and within `bounds`, else what to fix."""
    lo, hi = bounds
    if isinstance(value, bool) or not math.isfinite(value) or not lo <= value <= hi:
        return f"{name} must be a finite number in [{lo:g}, {hi:g}] (got {value})"
    return None


def _quota(lo: float, hi: float, doc: str) -> Any:
    """A quota: unlimited (None) by default, else within [lo, hi]; `doc`: one line."""
    return field(default=None, metadata={"range": (lo, hi), "doc": doc})


@dataclass(frozen=True, slots=True)
class TenantQuotas:
    """Per-tenant limits; None means unlimited. The one declaration of the quotas'
    names, kinds (int or float) and ranges: the tenants file, the admin API and the
    admin CLI read them from here (QUOTA_RANGES, INTEGER_QUOTAS)."""

    requests_per_s: float | None = _quota(1e-6, 1e6, "Requests per second (token bucket).")
    requests_burst: float | None = _quota(
        1.0, 1e9, "Requests that may arrive at once; default: one second's worth (at least 1)."
    )
    tokens_per_min: float | None = _quota(
        1.0, 1e12, "Tokens (prompt + max_tokens) per minute, reserved at admission."
    )
    tokens_burst: float | None = _quota(
        1.0, 1e12, "Tokens that may be reserved at once; default: one minute's worth."
    )
    max_concurrent: int | None = _quota(1, 1_000_000, "Requests in flight at once.")
    max_queued: int | None = _quota(1, 1_000_000, "Requests waiting in the queue at once.")
    max_queue_wait_s: float | None = _quota(
        1e-3, 86_400.0, "Longest wait in the queue before the request is refused."
    )
    max_prompt_tokens: int | None = _quota(1, 100_000_000, "Longest prompt, in tokens.")
    max_output_tokens: int | None = _quota(
        1, 100_000_000, "Most output tokens one request may ask for."
    )
    max_output_tokens_interactive: int | None = _quota(
        1,
        100_000_000,
        "A lower output cap for interactive traffic (long generations belong in batch).",
    )

    def problems(self, rules: bool = True) -> list[tuple[str, str]]:
        """(field, what to fix) for every invalid value; `rules`: also the rules
        between quotas (off to judge a partial update, whose rest is elsewhere)."""
        out: list[tuple[str, str]] = []
        for name, bounds in QUOTA_RANGES.items():
            value = getattr(self, name)
            msg = None if value is None else range_problem(name, value, bounds)
            if msg:
                out.append((name, msg + "; omit it or set it to null for no limit"))
        if rules and self.requests_burst is not None and self.requests_per_s is None:
            out.append(("requests_burst", "requests_burst needs requests_per_s"))
        if rules and self.tokens_burst is not None and self.tokens_per_min is None:
            out.append(("tokens_burst", "tokens_burst needs tokens_per_min"))
        return out

    @property
    def request_burst(self) -> float | None:
        if self.requests_per_s is None:
            return None
        return self.requests_burst or max(1.0, self.requests_per_s)

    @property
    def token_burst(self) -> float | None:
        if self.tokens_per_min is None:
            return None
        return self.tokens_burst or self.tokens_per_min

    def output_cap_tokens(self, priority: Priority) -> int | None:
        """The most output tokens one request of this class may ask for."""
        caps = [self.max_output_tokens]
        if priority is Priority.INTERACTIVE:
            caps.append(self.max_output_tokens_interactive)
        present = [c for c in caps if c is not None]
        return min(present) if present else None


QUOTA_RANGES: dict[str, tuple[float, float]] = {
    f.name: f.metadata["range"] for f in dataclasses.fields(TenantQuotas)
}
INTEGER_QUOTAS = frozenset(
    name for name, hint in get_type_hints(TenantQuotas).items() if hint == int | None
)


@dataclass(frozen=True, slots=True)
class TenantConfig:
    tenant_id: str
    # Share of the engine relative to other backlogged tenants (VTC weight).
    weight: float = 1.0
    priorities: frozenset[Priority] = ALL_PRIORITIES
    enabled: bool = True
    quotas: TenantQuotas = field(default_factory=TenantQuotas)
    # Over a rate quota: "reject" at once with a retry delay, or "wait" queued.
    over_quota: OverQuotaMode = "reject"
    # Spend per calendar window (scheduler/tenancy/budgets.py), checked before queueing.
    budgets: tuple[Budget, ...] = ()

    def problems(self, rules: bool = True) -> list[tuple[str, str]]:
        """(field, what to fix) for every invalid value (see TenantQuotas.problems)."""
        out: list[tuple[str, str]] = []
        id_problem = tenant_id_problem(self.tenant_id)
        if id_problem:
            out.append(("id", id_problem))
        weight_problem = range_problem("weight", self.weight, WEIGHT_RANGE)
        if weight_problem:
            out.append(("weight", weight_problem))
        if not self.priorities:
            out.append(("priorities", "allow at least one priority class"))
        if self.over_quota not in OVER_QUOTA_MODES:
            out.append(("over_quota", f"must be one of {list(OVER_QUOTA_MODES)}"))
        out.extend((f"quotas.{name}", msg) for name, msg in self.quotas.problems(rules))
        out.extend(budget_problems(self.budgets))
        return out

    def validated(self) -> TenantConfig:
        problems = self.problems()
        if problems:
            raise ValueError(
                f"tenant {self.tenant_id!r}: " + "; ".join(f"{f}: {m}" for f, m in problems)
            )
        return self


_MAX_TEMPLATE_COPIES = 65536


class TenantRegistry:
    """Tenant id → config. Immutable; build a new one to reconfigure.

    `template`, when set, makes the registry permissive: unknown tenant ids get
    a copy of it (used when no tenant file is configured).
    """

    def __init__(
        self,
        tenants: Iterable[TenantConfig],
        *,
        default_tenant_id: str | None = None,
        template: TenantConfig | None = None,
    ) -> None:
        self._tenants: dict[str, TenantConfig] = {}
        for t in tenants:
            if t.tenant_id in self._tenants:
                raise ValueError(f"tenant {t.tenant_id!r} is defined twice")
            self._tenants[t.tenant_id] = t.validated()
        self.template = template.validated() if template else None
        self._from_template: dict[str, TenantConfig] = {}
        if default_tenant_id is not None and self._lookup(default_tenant_id) is None:
            raise ValueError(f"default tenant {default_tenant_id!r} is not defined")
        self.default_tenant_id = default_tenant_id

    @classmethod
    def permissive(cls, default_tenant_id: str | None = "default") -> TenantRegistry:
        """Every tenant allowed, weight 1, no quotas: the no-config behaviour."""
        return cls([], default_tenant_id=default_tenant_id, template=TenantConfig("default"))

    def _lookup(self, tenant_id: str) -> TenantConfig | None:
        cfg = self._tenants.get(tenant_id)
        if cfg is None and self.template is not None and tenant_id:
            # Memoized: this runs on the hot path. Bounded, because in permissive
            # mode any caller-chosen id lands here.
            cfg = self._from_template.get(tenant_id)
            if cfg is None:
                if len(self._from_template) >= _MAX_TEMPLATE_COPIES:
                    self._from_template.clear()
                cfg = dataclasses.replace(self.template, tenant_id=tenant_id)
                self._from_template[tenant_id] = cfg
        return cfg

    def get(self, tenant_id: str) -> TenantConfig | None:
        return self._lookup(tenant_id)

    def configured(self, tenant_id: str) -> bool:
        """Declared by the operator (not a copy of the permissive template)."""
        return tenant_id in self._tenants

    def resolve(self, tenant_id: str | None, priority: Priority | None = None) -> TenantConfig:
        """The config that serves this request; raises TenantRefused subclasses."""
        if not tenant_id:
            if self.default_tenant_id is None:
                raise TenantRequired(
                    "", "the request names no tenant and the server has no default tenant"
                )
            tenant_id = self.default_tenant_id
        cfg = self._lookup(tenant_id)
        if cfg is None:
            raise UnknownTenant(tenant_id, f"unknown tenant {tenant_id!r}")
        if not cfg.enabled:
            raise TenantDisabled(tenant_id, f"tenant {tenant_id!r} is disabled")
        if priority is not None and priority not in cfg.priorities:
            allowed = ", ".join(p.name.lower() for p in sorted(cfg.priorities))
            raise PriorityNotAllowed(
                tenant_id,
                f"tenant {tenant_id!r} may not send {priority.name.lower()} requests "
                f"(allowed: {allowed})",
            )
        return cfg

    def weight_of(self, tenant_id: str) -> float:
        cfg = self._tenants.get(tenant_id)
        if cfg is not None:
            return cfg.weight
        return self.template.weight if self.template is not None else 1.0

    def __iter__(self) -> Iterator[TenantConfig]:
        return iter(self._tenants.values())

    def __len__(self) -> int:
        return len(self._tenants)

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self._tenants
