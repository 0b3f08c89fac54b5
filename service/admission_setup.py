"""Admission's options from the settings and the engine's capacity.

The limits (a share of the engine's slots and KV), the queue policy's options,
the isolation the engine allows, and the loop that keeps the limits in step
with the capacity. The server (service/app.py) and the virtual bench build
admission from these, so both read the settings the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.clock import Clock
from scheduler.gate import AdmissionGate
from scheduler.ordering.policies import PolicyOptions
from scheduler.tenancy.tenants import TenantRegistry
from service.engines.protocol import Engine, EngineCapacity
from service.settings import Settings

log = logging.getLogger(__name__)


def admission_limits(cap: EngineCapacity, settings: Settings) -> AdmissionLimits:
    return AdmissionLimits(
        max_requests=max(1, int(cap.max_running_requests * settings.running_target_fraction)),
        max_kv_tokens=max(1, int(cap.max_total_tokens * settings.kv_target_fraction)),
    )


def policy_options(
    settings: Settings,
    clock: Clock,
    tenants: TenantRegistry,
    weight_of: Callable[[str], float] | None = None,
) -> PolicyOptions:
    """The queue policy's options from the settings."""
    return PolicyOptions(
        clock=clock,
        tenants=tenants,
        weight_of=weight_of,
        vtc_w_in=settings.vtc_w_in,
        vtc_w_out=settings.vtc_w_out,
        vtc_w_cached=settings.vtc_w_cached,
        light_credit=settings.fair_light_credit,
        rate_limit_per_s=settings.rate_limit_per_s,
        rate_limit_burst=settings.rate_limit_burst or None,
    )


def isolation_for(settings: Settings, cap: EngineCapacity) -> rules.Isolation:
    """Settings' fair_isolation against what the engine can do. `auto` lends
    where the engine preempts, except beside staggered prefill (a pool's
    isolation levers, issue #33), where it keeps the reserve: the lent room fills
    every worker's KV, which then evicts the shared prefixes locality placed
    requests for, and their prompts are prefilled whole in 2 048-token chunks on
    workers the placement counted nearly free (prefix mix, four workers, 60 s:
    the light tenant's TTFT p99 14.4x solo lent, 2.1x kept; docs/benchmarks.md,
    session 21). Beside the reserve, `fair_light_takes_slot` on such engines
    makes it RESERVE_SLOTS."""
    setting = settings.fair_isolation
    if setting == "reserve" or (setting == "auto" and settings.sglang_stagger_prefill_tokens):
        # fair_light_takes_slot: the engine retracts a running request for a light
        # one, so admission may lend it a slot beyond the room (never KV).
        if settings.fair_light_takes_slot and cap.preempt_threshold is not None:
            return rules.Isolation.RESERVE_SLOTS
        return rules.Isolation.RESERVE
    if cap.preempt_threshold is None:
        if setting == "preempt":
            raise ValueError(
                "fair_isolation=preempt needs an engine that preempts by priority (SGLang "
                "with --enable-priority-scheduling and without --disable-priority-preemption)"
            )
        return rules.Isolation.RESERVE
    return rules.Isolation.PREEMPT


async def follow_capacity(engine: Engine, dispatcher: AdmissionGate, settings: Settings) -> None:
    """Keep the admission limits in step with the engine's capacity (pools shrink and grow)."""
    while True:
        await asyncio.sleep(settings.capacity_refresh_s)
        limits = admission_limits(engine.capacity(), settings)
        if limits != dispatcher.budget.limits:
            log.info("admission limits now %s", limits)
            dispatcher.set_limits(limits)
