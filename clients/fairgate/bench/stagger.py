"""`fairgate bench stagger`: issue #33's isolation levers on the virtual fleet.

N simulated 4090 engines (Llama-3.1-8B int4, SGLang's 2048-token prefill chunks,
16 running requests each) behind the server's placement, on a fake clock (exact
repeats, no machine noise), with a light chat tenant at 2 requests/s beside
one of two mixes:

- `long`: two tenants with cold 1-6 k-token prompts and one with 200-1500
  (rates scaled to the engines);
- `prefix`: `bench fleet`'s prefix-heavy mix without its conversations (a long
  system prompt shared by one tenant's requests, a few 2-4 k-token documents
  shared by another's; `fleet_scenarios.py`) at load 0.6.

Each trace runs under each lever combination (`levers`: none, staggered
prefill, staged prefill, the cold-start hold, all three; staged prefill of
only the prompts cold where they go, alone and with the other two; each
engine's cache as its KV events tell it, `kv_feed.py`, instead of the
approximate prefix index, alone and beside those two) and the light
tenant's arrivals alone on the same engines (its solo run); `stagger_report.py`
turns the runs into the table (median and spread over the seeds).

`replicas`: as many fairgate replicas in front of the engines, each placing its
share of the requests (admission stays one fleet-wide decision); `share`: they
hear each other's long prefills and routes, as prefix_share.py carries them live.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fairgate.bench.event_driver import Arrival, Driver
from fairgate.bench.fleet_scenarios import FleetScenario
from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.ordering.policies import make_policy
from scheduler.rules import Isolation
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.app import isolation_for, policy_options
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset
from service.engines.staged_prefill import StagedPrefill
from service.engines.stagger import Stagger
from service.settings import Settings

KV_PER_ENGINE = 60_000
SLOTS = 16
CHUNK_TOKENS = 2048
LIGHT = "light"
TENANTS = ("code", "docs", "conv", "sys", "rag", LIGHT)
# tenant: (requests/s on four engines, prompt tokens low, high)
HEAVY = {"code": (1.2, 1000, 6000), "docs": (1.2, 1000, 6000), "conv": (2.0, 200, 1500)}
LIGHT_RATE = 2.0
PREFIX_LOAD = 0.6
# Admission as the server's defaults set it (policy, light credit, cached-token
# charge, locality allowance, the room lent or kept for light tenants), whatever
# the environment says.
SETTINGS = Settings.model_construct()


@dataclass(frozen=True, slots=True)
class Levers:
    """One lever combination: staggered prefill and the cold-start hold from
    `min_tokens` uncached tokens (0: neither), staged prefill in stages of
    `stage_tokens` for prompts longer than one chunk (0: off), and the
    placement's view of each engine's cache from its KV events (lever 3)."""

    keep_free: bool = False
    hold_max_s: float = 0.0
    stage_tokens: int = 0
    min_tokens: int = 1024
    # Staged prefill only for prompts cold where the placement sends them.
    cold_only: bool = False
    kv_events: bool = False
    # The worker kept on short steps stays below this much prefill (0: min_tokens).
    keep_tokens: int = 0
    # Staged prefill from this many prompt tokens (default: past one chunk).
    stage_min_tokens: int = CHUNK_TOKENS + 1
    # Short prompts paced to this much queued prefill a worker (with the hold; 0: off).
    pace_tokens: int = 0
    # Stages of up to this many tokens where the stagger shelters the worker (0: off).
    sheltered_tokens: int = 0
    # A short prompt goes between a long one's stages in a worker's lane.
    short_first: bool = False

    def stagger(self) -> Stagger | None:
        if not (self.keep_free or self.hold_max_s):
            return None
        return Stagger(
            min_tokens=self.min_tokens,
            keep_tokens=self.keep_tokens,
            keep_free=self.keep_free,
            hold_max_s=self.hold_max_s,
            pace_tokens=self.pace_tokens,
        )

    def staged(self) -> StagedPrefill | None:
        if not self.stage_tokens:
            return None
        return StagedPrefill(
            min_tokens=self.stage_min_tokens,
            stage_tokens=self.stage_tokens,
            cold_only=self.cold_only,
            sheltered_stage_tokens=self.sheltered_tokens,
            short_first=self.short_first,
        )


def levers(
    min_tokens: int,
    hold_max_s: float,
    stage_tokens: int,
    keep_tokens: int = 0,
    stage_min_tokens: int = CHUNK_TOKENS + 1,
    pace_tokens: int = 0,
    sheltered_tokens: int = 0,
    short_first: bool = False,
) -> dict[str, Levers]:
    """The combinations the table compares, in its order (`keep_tokens`,
    `stage_min_tokens`, `pace_tokens`, `sheltered_tokens`, `short_first`: every
    combination's, see `Levers`)."""
    return {
        name: dataclasses.replace(
            lev,
            keep_tokens=keep_tokens,
            stage_min_tokens=stage_min_tokens,
            pace_tokens=pace_tokens,
            sheltered_tokens=sheltered_tokens,
            short_first=short_first,
        )
        for name, lev in _levers(min_tokens, hold_max_s, stage_tokens).items()
    }


def _levers(min_tokens: int, hold_max_s: float, stage_tokens: int) -> dict[str, Levers]:
    return {
        "none": Levers(min_tokens=min_tokens),
        "stagger": Levers(keep_free=True, min_tokens=min_tokens),
        "staged": Levers(stage_tokens=stage_tokens, min_tokens=min_tokens),
        "hold": Levers(hold_max_s=hold_max_s, min_tokens=min_tokens),
        "all": Levers(True, hold_max_s, stage_tokens, min_tokens),
        "staged-cold": Levers(stage_tokens=stage_tokens, min_tokens=min_tokens, cold_only=True),
        "all-cold": Levers(True, hold_max_s, stage_tokens, min_tokens, cold_only=True),
        "kv": Levers(min_tokens=min_tokens, kv_events=True),
        "staged-cold+kv": Levers(
            stage_tokens=stage_tokens, min_tokens=min_tokens, cold_only=True, kv_events=True
        ),
        "all-cold+kv": Levers(
            True, hold_max_s, stage_tokens, min_tokens, cold_only=True, kv_events=True
        ),
    }


def _light(seed: int, seconds: float) -> list[Arrival]:
    """The light tenant's arrivals: its own generator, so every mix (and its solo
    run) has the same ones."""
    rng, out = random.Random(f"{seed}:{LIGHT}"), []
    t = rng.expovariate(LIGHT_RATE)
    while t < seconds:
        out.append(Arrival(t, LIGHT, rng.randint(20, 100), rng.randint(16, 64)))
        t += rng.expovariate(LIGHT_RATE)
    return out


def long_prompt_mix(
    seed: int, seconds: float, engines: int = 4, heavy: bool = True, load: float = 1.0
) -> list[Arrival]:
    """The seeded long-prompt trace: heavy tenants' rates scale with the engines
    (4 = as listed) and `load`; `heavy` False: the light tenant alone."""
    rng = random.Random(seed)
    out = []
    for tenant, (rate, lo, hi) in HEAVY.items() if heavy else ():
        per_s = rate * engines / 4 * load
        t = rng.expovariate(per_s)
        while t < seconds:
            out.append(Arrival(t, tenant, rng.randint(lo, hi), rng.randint(64, 256)))
            t += rng.expovariate(per_s)
    return sorted(out + _light(seed, seconds), key=lambda a: a.at_s)


def prefix_heavy_mix(
    seed: int, seconds: float, engines: int = 4, load: float = 1.0
) -> list[Arrival]:
    """`bench fleet`'s shared-prefix tenants (sys, rag; its conversations left out:
    their turns wait on replies, which an open trace cannot) at `load` x
    `PREFIX_LOAD`, beside the light tenant."""
    plan = FleetScenario(engines, seconds, PREFIX_LOAD * load).plan(seed)
    out = [
        Arrival(i.t_s, i.tenant, len(i.prompt_ids), i.max_tokens, prompt_ids=i.prompt_ids)
        for i in plan
        if i.tenant in ("sys", "rag")
    ]
    return sorted(out + _light(seed, seconds), key=lambda a: a.at_s)


def _long(seed: int, seconds: float, engines: int, load: float) -> list[Arrival]:
    return long_prompt_mix(seed, seconds, engines, load=load)


# mix: (seed, seconds, engines, load: the heavy tenants' rates x this) -> its trace
MIXES: dict[str, Callable[[int, float, int, float], list[Arrival]]] = {
    "long": _long,
    "prefix": prefix_heavy_mix,
}


def solo(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The light tenant's arrivals of a trace, alone."""
    return [a for a in arrivals if a.tenant_id == LIGHT]


@dataclass(frozen=True, slots=True)
class EngineMode:
    """How the engines schedule, and admission's isolation beside them:
    `priority`, by priority with preemption (SGLang's --enable-priority-scheduling,
    as `bench fleet`'s workers), else FCFS; `isolation`, the server's
    fair_isolation setting, resolved as the server does (`isolation_for`: `auto`
    lends room beyond engines that preempt, except beside staggered prefill)."""

    priority: bool = False
    isolation: str = "auto"
    # fair_light_takes_slot: beside the reserve, a light request takes a full
    # worker's slot by preemption, and admission lends it a slot (RESERVE_SLOTS).
    takes_slot: bool = False
    # fair_light_takes_unsent_slots: ... and the slots of requests held unsent.
    unsent: bool = False
    # False, a what-if: what is sent in answer to an engine's emission (a staged
    # prompt's next stage, the lane's next request) reaches it before its next
    # step forms, as if the engine queued it itself (`SimWorker.late`). Live the
    # answer crosses the gateway and the engine has formed that step already.
    round_trip: bool = True

    def resolve(self, stagger: Stagger | None, sim: SimConfig) -> Isolation:
        """Admission's isolation beside engines of `sim` (`sim_config`) and `stagger`."""
        settings = SETTINGS.model_copy(
            update={
                "fair_isolation": self.isolation,
                "fair_light_takes_slot": self.takes_slot,
                "sglang_stagger_prefill_tokens": stagger.min_tokens if stagger else 0,
            }
        )
        return isolation_for(settings, sim.engine_capacity())


# Every table before session 21: FCFS engines (so the reserve).
FCFS = EngineMode()
ENGINE_MODES = {
    "auto": EngineMode(True),
    "preempt": EngineMode(True, "preempt"),
    "reserve": EngineMode(True, "reserve"),
    "auto+slot": EngineMode(True, "auto", takes_slot=True),
    "auto+unsent": EngineMode(True, "auto", takes_slot=True, unsent=True),
    "fcfs": FCFS,
}


def sim_config(kv_tokens: int | None = None, priority: bool = False) -> SimConfig:
    """The engines: `priority`, they schedule by priority and preempt (`EngineMode`)."""
    return SimConfig(
        cost=preset(),
        max_running_requests=SLOTS,
        chunked_prefill_size=CHUNK_TOKENS,
        kv_capacity_tokens=kv_tokens,
        priority_scheduling=priority,
    )


def admitted_kv(engines: int, kv_tokens: int | None) -> int:
    """Admission's KV budget: KV_PER_ENGINE each (engines of the preset's KV, more),
    or, with `kv_tokens` per engine, as the server sets it on such engines
    (kv_target_fraction of their capacity: `bench fleet`'s live workers)."""
    if kv_tokens is None:
        return KV_PER_ENGINE * engines
    return int(kv_tokens * engines * SETTINGS.kv_target_fraction)


def fleet(
    arrivals: list[Arrival],
    engines: int,
    stagger: Stagger | None,
    staged: StagedPrefill | None = None,
    replicas: int = 1,
    share: bool = True,
    kv_events: bool = False,
    kv_tokens: int | None = None,
    mode: EngineMode = FCFS,
) -> Driver:
    """The trace through `engines` engines behind the server's placement (one engine
    too: a pool of one, so that the levers that live in the placement apply);
    `kv_tokens`: each engine's KV capacity (None: the preset's), see `admitted_kv`;
    `mode`: the engines' scheduling and admission's isolation (`EngineMode`)."""
    sim = sim_config(kv_tokens, mode.priority)
    isolation = mode.resolve(stagger, sim)
    lend = isolation is Isolation.PREEMPT
    reg, clock, st = TenantRegistry([TenantConfig(t) for t in TENANTS]), FakeClock(), SETTINGS
    drv = Driver(
        make_policy(st.policy, policy_options(st, clock, reg)),
        AdmissionLimits(
            max_requests=SLOTS * engines, max_kv_tokens=admitted_kv(engines, kv_tokens)
        ),
        sim,
        tenants=reg,
        w_in=st.vtc_w_in,
        w_out=st.vtc_w_out,
        clock=clock,
        reserve_fraction=st.light_share(lend),
        isolation=isolation,
        allowance=st.fair_allowance_tokens,
        engines=engines,
        routing="locality",
        stagger=stagger,
        staged_prefill=staged,
        replicas=replicas,
        share=share,
        kv_events=kv_events,
        lend_unsent=mode.unsent and isolation is Isolation.RESERVE_SLOTS,
        round_trip=mode.round_trip,
    )
    drv.run(arrivals, max_steps=10_000_000)
    return drv


def light_ttft_s(drv: Driver) -> list[float]:
    return sorted(
        c.first_token_s - c.arrival.at_s
        for c in drv.calls
        if c.arrival.tenant_id == LIGHT and c.first_token_s is not None
    )


def others_ttft_s(drv: Driver) -> list[float]:
    """The heavy tenants' TTFT, sorted: what isolating the light tenant costs them."""
    return sorted(
        c.first_token_s - c.arrival.at_s
        for c in drv.calls
        if c.arrival.tenant_id != LIGHT and c.first_token_s is not None
    )


def quantile(xs: Sequence[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def tokens_per_s(drv: Driver) -> float:
    """Prompt and output tokens of the requests done, over the run."""
    ends = [c.done_s for c in drv.calls if c.done_s is not None]
    done = sum(c.arrival.prompt_tokens + c.output_tokens for c in drv.calls if c.done_s)
    return done / max(ends)
