"""Settings → the dispatcher, the tenant store and the API keys' limit state: in
memory (one replica), or shared by every replica in Redis (store=redis)."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Literal

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.gate import AdmissionGate
from scheduler.key_gate import KeyState, MemoryKeyState
from scheduler.local_admission import local_dispatcher
from scheduler.ordering.policies import PolicyOptions, make_policy
from scheduler.redis_io import connect
from scheduler.request import Locality, Unsent
from scheduler.shared.admission import SharedOptions, shared_dispatcher
from scheduler.state.redis_key_state import RedisKeyState
from scheduler.state.redis_store import RedisStore
from scheduler.tenancy.redis_tenant_store import RedisTenantStore
from scheduler.tenancy.tenant_store import InMemoryTenantStore, TenantStore
from scheduler.tenancy.tenants import TenantRegistry
from service.engines.placement import Placement
from service.engines.prefix_share import PrefixShare
from service.settings import Settings
from service.usage_log import MemoryUsageLog, RedisUsageLog, UsageLog

log = logging.getLogger(__name__)


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def build_tenant_store(settings: Settings) -> TenantStore:
    """Tenants and key hashes: per process, or in Redis for the whole fleet."""
    if settings.store == "redis":
        if not settings.api_key_pepper:
            log.warning(
                "store=redis without FAIRGATE_API_KEY_PEPPER: API keys issued here will not "
                "verify on other replicas, nor after a restart"
            )
        return RedisTenantStore.from_url(
            settings.redis_url, timeout_s=settings.redis_timeout_s, prefix=settings.redis_prefix
        )
    return InMemoryTenantStore()


def build_key_state(settings: Settings, clock: Clock) -> KeyState:
    """API keys' own buckets and open requests: per process, or in Redis (exact for
    the whole fleet)."""
    if settings.store == "redis":
        return RedisKeyState.from_url(
            settings.redis_url,
            timeout_s=settings.redis_timeout_s,
            prefix=settings.redis_prefix,
            lease_ttl_s=settings.redis_lease_ttl_s,
        )
    return MemoryKeyState(clock)


async def close_tenant_store(store: TenantStore) -> None:
    if isinstance(store, RedisTenantStore):
        await store.aclose()


async def build_dispatcher(
    settings: Settings,
    options: PolicyOptions,
    limits: AdmissionLimits,
    clock: Clock,
    tenants: TenantRegistry,
    model_name: str,
    isolation: rules.Isolation = rules.Isolation.RESERVE,
    locality: Locality | None = None,
    unsent: Unsent | None = None,
) -> AdmissionGate:
    """`locality`: the engine pool's prefix index, for locality-aware admission;
    `unsent`: its admitted requests held unsent (RESERVE_SLOTS lends their slots)."""
    if settings.store == "memory":
        return local_dispatcher(
            make_policy(settings.policy, options),
            AdmissionBudget(limits),
            clock,
            tenants=tenants,
            reserve_fraction=settings.light_share(isolation is rules.Isolation.PREEMPT),
            reserve_window_s=settings.fair_reserve_window_s,
            isolation=isolation,
            idle_ttl_s=settings.idle_tenant_ttl_s,
            locality=locality,
            allowance=settings.fair_allowance_tokens,
            unsent=unsent,
        )
    if settings.policy != "vtc":
        raise ValueError("store=redis shares the vtc policy's state; set policy=vtc")
    store = RedisStore.from_url(
        settings.redis_url,
        timeout_s=settings.redis_timeout_s,
        domain=settings.redis_domain or model_name,
        prefix=settings.redis_prefix,
        lease_ttl_s=settings.redis_lease_ttl_s,
        backlog_ttl_s=3 * settings.redis_heartbeat_s,
    )
    mode: Literal["open", "closed"] = (
        "closed" if settings.redis_failure_mode == "closed" else "open"
    )
    shared = shared_dispatcher(
        store,
        limits,
        clock,
        SharedOptions(
            replica_id=replica_id(),
            failure_mode=mode,
            replicas=settings.replica_processes,
            reserve_fraction=settings.light_share(isolation is rules.Isolation.PREEMPT),
            reserve_window_s=settings.fair_reserve_window_s,
            isolation=isolation,
            light_credit=settings.fair_light_credit,
            allowance=settings.fair_allowance_tokens,
            w_in=settings.vtc_w_in,
            w_out=settings.vtc_w_out,
            w_cached=settings.vtc_w_cached,
            locality=locality,
            unsent=unsent,
            flush_s=settings.redis_flush_ms / 1000,
            poll_s=settings.redis_poll_ms / 1000,
            heartbeat_s=settings.redis_heartbeat_s,
            retry_s=settings.redis_retry_s,
            failover_after_failures=settings.redis_failover_after_failures,
            failover_after_s=settings.redis_failover_after_s,
            idle_ttl_s=settings.idle_tenant_ttl_s,
        ),
        tenants=tenants,
    )
    await shared.start()
    return shared


def build_prefix_share(settings: Settings, model_name: str, placement: Placement) -> PrefixShare:
    """With store=redis, the replicas' pools tell each other what they routed where,
    which prefills are still running there (staggered prefill, routing), and how
    many requests each has in flight on each worker (routing's fullness), and when
    a light tenant's request was placed (staggered prefill's light tenant)."""
    client = connect(settings.redis_url, timeout_s=settings.redis_timeout_s)
    domain = settings.redis_domain or model_name
    stream = f"{settings.redis_prefix}:{{{domain}}}:routes"
    share = PrefixShare(
        client,
        stream,
        replica_id(),
        placement.learn,
        learn_prefill=placement.learn_prefill,
        learn_load=placement.learn_load,
        learn_light=placement.learn_light,
    )
    placement.on_routed = share.publish
    placement.on_prefill = share.publish_prefill
    placement.on_load = share.publish_load
    placement.on_light = share.publish_light
    return share


def build_usage_log(settings: Settings) -> UsageLog:
    """The usage log billing reads (service/usage_log.py): a Redis stream every
    replica writes with store=redis, else this process's memory."""
    offset_min = settings.budget_utc_offset_min
    if settings.store != "redis":
        return MemoryUsageLog(utc_offset_min=offset_min)
    usage = RedisUsageLog(
        connect(settings.redis_url, timeout_s=settings.redis_timeout_s),
        settings.redis_prefix,
        utc_offset_min=offset_min,
    )
    usage.start()
    return usage
