"""Tenants: their fair-share weight, allowed classes, quotas, and the registry.

A tenant is who pays for a request (resolved from the API key, never from a
client-supplied field). The registry maps a tenant id to its config; requests
without a tenant go to the default tenant, or are refused when there is none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from scheduler.errors import (
    PriorityNotAllowed,
    TenantDisabled,
    TenantRequired,
    UnknownTenant,
)
from scheduler.request import Priority

OverQuotaMode = Literal["reject", "wait"]
OVER_QUOTA_MODES: tuple[OverQuotaMode, ...] = ("reject", "wait")
ALL_PRIORITIES = frozenset(Priority)


def _positive(name: str, value: float | None) -> str | None:
    if value is None:
        return None
    if math.isnan(value) or value <= 0:
        return f"{name} must be > 0 (got {value}); omit it or set it to null for no limit"
    return None


@dataclass(frozen=True, slots=True)
class TenantQuotas:
    """Per-tenant limits; None means unlimited."""

    requests_per_s: float | None = None
    # Requests that may arrive at once; default: one second's worth (at least 1).
    requests_burst: float | None = None
    tokens_per_min: float | None = None
    # Tokens (prompt + max_tokens) that may be reserved at once; default: one minute's worth.
    tokens_burst: float | None = None
    max_concurrent: int | None = None
    max_queued: int | None = None
    max_queue_wait_s: float | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    # A lower output cap for interactive traffic (long generations belong in batch).
    max_output_tokens_interactive: int | None = None

    def problems(self) -> list[tuple[str, str]]:
        """(field, what to fix) for every invalid value."""
        out: list[tuple[str, str]] = []
        for f in dataclasses.fields(self):
            msg = _positive(f.name, getattr(self, f.name))
            if msg:
                out.append((f.name, msg))
        if self.requests_burst is not None and self.requests_per_s is None:
            out.append(("requests_burst", "requests_burst needs requests_per_s"))
        if self.tokens_burst is not None and self.tokens_per_min is None:
            out.append(("tokens_burst", "tokens_burst needs tokens_per_min"))
        if self.requests_burst is not None and 0 < self.requests_burst < 1:
            out.append(("requests_burst", "requests_burst must be >= 1 or no request ever passes"))
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

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not self.tenant_id:
            out.append(("id", "the tenant id must not be empty"))
        if math.isnan(self.weight) or not math.isfinite(self.weight) or self.weight <= 0:
            out.append(("weight", f"weight must be a finite number > 0 (got {self.weight})"))
        if not self.priorities:
            out.append(("priorities", "allow at least one priority class"))
        if self.over_quota not in OVER_QUOTA_MODES:
            out.append(("over_quota", f"must be one of {list(OVER_QUOTA_MODES)}"))
        out.extend((f"quotas.{name}", msg) for name, msg in self.quotas.problems())
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
