"""`fairgate bench fairness`: the same arrival trace through each queue policy.

For each scenario (see fairness_scenarios.py) the trace — arrival times,
tenants, prompt lengths and max_tokens — is drawn once and replayed against a
fresh gateway per policy; the client measures per-tenant service, TTFT and
rejections and prints the policies side by side. Times are simulated seconds.

One replica: a fairgate child process with the in-process simulator. With
`replicas >= 2`: one `sim-server` child (the SGLang stand-in) and one
throwaway redis-server; `vtc` runs on N fairgate children with store=redis
(the load spread round-robin), the `fcfs` baseline on one fairgate in front of
the same kind of sim-server (store=redis supports only vtc).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fairgate.bench.collector import collector_off
from fairgate.bench.common import child_server, server_process
from fairgate.bench.fairness_analysis import (
    RunResult as RunResult,  # "as": fleet*.py import it here
)
from fairgate.bench.fairness_analysis import analyse as analyse
from fairgate.bench.fairness_analysis import bound_for
from fairgate.bench.fairness_metrics import RequestRecord
from fairgate.bench.fairness_report import print_report
from fairgate.bench.fairness_scenarios import (
    KV_CAPACITY_TOKENS,
    KV_TARGET_FRACTION,
    M_TOKENS,
    MAX_RUNNING_REQUESTS,
    SHAPES,
    Arrival,
    Scenario,
    scenarios,
)
from fairgate.bench.fairness_virtual import replay as replay_virtual
from fairgate.bench.generate_record import record_stream
from fairgate.bench.redis_local import throwaway_redis
from fairgate.bench.workload import distinct_prompt_ids
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from service.settings import ISOLATIONS, Settings

MODEL = "llama-3.1-8b-int4"
POLICIES = ("fcfs", "rate-limit", "vtc")
# The simulated engine's prefill chunk (Settings.sim_chunked_prefill_tokens).
CHUNK_TOKENS = 2048
SOLO = "victim solo"


@dataclass(frozen=True)
class Policy:
    """A policy to run: `vtc@0.0625` is vtc with that share for light tenants
    (fair_reserve_fraction and fair_lend_fraction: kept or lent, whichever the
    isolation uses), `vtc:reserve` / `vtc:preempt` with that fair_isolation
    (default: auto)."""

    name: str
    reserve_fraction: float | None = None
    isolation: str | None = None
    # Staged prefill with stages of this many tokens (None: off), one staged
    # prompt at a time per engine unless `stages_free`.
    stage_tokens: int | None = None
    stages_free: bool = False

    @classmethod
    def parse(cls, spec: str) -> Policy:
        head, _, frac = spec.strip().partition("@")
        name, _, isolation = head.partition(":")
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r} (available: {', '.join(POLICIES)})")
        if (frac or isolation) and name != "vtc":
            raise ValueError(f"{spec!r}: only vtc takes a reserve fraction or an isolation")
        if isolation and isolation not in ISOLATIONS:
            raise ValueError(f"{spec!r}: the isolation must be one of {', '.join(ISOLATIONS)}")
        try:
            fraction = float(frac) if frac else None
        except ValueError:
            raise ValueError(f"{spec!r}: the reserve fraction must be a number") from None
        if fraction is not None and not 0 <= fraction < 1:
            raise ValueError(f"{spec!r}: the reserve fraction must be in [0, 1)")
        return cls(name, fraction, isolation or None)

    def staged(self, spec: str) -> Policy:
        """The same policy with staged prefill: `N` (prompts longer than one prefill
        chunk go in stages of N tokens, one such prompt at a time) or `N:free` (all
        at once)."""
        size, _, mode = spec.strip().partition(":")
        if not size.isdigit() or int(size) < 1 or mode not in ("", "free"):
            raise ValueError(f"{spec!r}: a stage size is N or N:free, N a positive integer")
        return dataclasses.replace(self, stage_tokens=int(size), stages_free=mode == "free")

    @property
    def label(self) -> str:
        label = self.name if self.isolation is None else f"{self.name}:{self.isolation}"
        if self.reserve_fraction is not None:
            label = f"{label}@{self.reserve_fraction:g}"
        if self.stage_tokens is None:
            return label
        return f"{label} st{self.stage_tokens}" + (":free" if self.stages_free else "")

    def settings(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.stage_tokens is not None:
            # Prompts longer than one prefill chunk: a shorter one is one step anyway.
            out["staged_prefill_min_tokens"] = CHUNK_TOKENS + 1
            out["staged_prefill_stage_tokens"] = self.stage_tokens
            out["staged_prefill_one_at_a_time"] = not self.stages_free
        # The baselines run as the engine would alone: no fair-share reserve.
        if self.name != "vtc":
            return {**out, "policy": self.name, "fair_reserve_fraction": 0, "fair_lend_fraction": 0}
        out["policy"] = "vtc"
        if self.reserve_fraction is not None:
            out["fair_reserve_fraction"] = self.reserve_fraction
            out["fair_lend_fraction"] = self.reserve_fraction
        if self.isolation is not None:
            out["fair_isolation"] = self.isolation
        return out


DEFAULT_POLICIES = tuple(Policy(name) for name in POLICIES)


async def _replay(
    addresses: list[str],
    trace: list[Arrival],
    time_scale: float,
    window_s: float,
    by_tenant: dict[str, int] | None = None,
) -> list[RequestRecord]:
    """Open loop: request i goes to replica i mod N at its arrival time, or, with
    `by_tenant`, to its tenant's replica (index mod N): each service calling a
    replica of its own, or a load balancer with affinity."""
    loop = asyncio.get_running_loop()
    channels = [grpc.aio.insecure_channel(a) for a in addresses for _ in range(2)]
    stubs = [pb_grpc.InferenceServiceStub(ch) for ch in channels]
    await asyncio.gather(*(s.ListModels(pb.ListModelsRequest()) for s in stubs))
    t0 = loop.time()

    def now_s() -> float:  # simulated seconds since the start
        return (loop.time() - t0) / time_scale

    async def one(i: int, rec: RequestRecord) -> None:
        replica = i if by_tenant is None else by_tenant[rec.tenant]
        replica %= len(addresses)
        stub = stubs[replica * 2 + (i // len(addresses)) % 2]
        req = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=distinct_prompt_ids(i, rec.prompt_tokens)),
            return_token_ids=True,
            sampling=pb.SamplingParams(max_tokens=rec.max_tokens, ignore_eos=True),
        )
        call = stub.Generate(req, metadata=(("x-fairgate-tenant", rec.tenant),))
        await record_stream(rec, call, now_s, time_scale)

    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []
    for i, a in enumerate(trace):
        delay = t0 + a.t_s * time_scale - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = RequestRecord(a.tenant, now_s(), a.prompt_tokens, a.max_tokens)
        records.append(rec)
        tasks.append(asyncio.create_task(one(i, rec)))
    await asyncio.sleep(max(0.0, t0 + window_s * time_scale - loop.time()))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    for rec in records:
        # Still streaming at the window's end: admission ~ first token.
        if rec.admitted_s is None and rec.first_token_s is not None:
            rec.admitted_s = rec.first_token_s
    return records


def _tenants_yaml(weights: dict[str, float]) -> str:
    lines = ["tenants:"]
    for t, w in weights.items():
        lines += [f"  - id: {t}", f"    weight: {w}"]
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def _gateways(
    policy: Policy, replicas: int, common: dict[str, object], time_scale: float, seed: int
) -> AsyncIterator[list[str]]:
    """Fresh servers for one run; yields the fairgate addresses."""
    if replicas == 1:
        sim = {
            "sim_max_running_requests": MAX_RUNNING_REQUESTS,
            "sim_kv_capacity_tokens": KV_CAPACITY_TOKENS,
            "sim_model": MODEL,
            "sim_time_scale": time_scale,
            "sim_seed": seed,
            # As SGLang with --enable-priority-scheduling: fairgate's priorities
            # order the engine's prefills (under FCFS they are all equal).
            "sim_priority_scheduling": True,
        }
        async with server_process("fairgate", **common, **sim) as address:
            yield [address]
        return
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(
            child_server(
                "service.engines.simulator.http_server",
                *("--port", "0", "--announce", "--model", MODEL),
                *("--time-scale", str(time_scale), "--seed", str(seed)),
                *("--max-running-requests", str(MAX_RUNNING_REQUESTS)),
                *("--kv-capacity-tokens", str(KV_CAPACITY_TOKENS)),
                "--enable-priority-scheduling",
            )
        )
        http = {"engine": "sglang-http", "sglang_urls": f"http://{engine.address}"}
        if policy.name != "vtc":  # store=redis supports only vtc: the baseline on one replica
            yield [await stack.enter_async_context(server_process("fairgate", **common, **http))]
            return
        redis = stack.enter_context(throwaway_redis("--replicas"))
        shared = {**http, "store": "redis", "redis_url": redis.url, "replicas": replicas}
        shared["api_key_pepper"] = "fairgate-bench-pepper"  # the same on every replica
        addresses = []
        for _ in range(replicas):
            ctx = server_process("fairgate", **common, **shared)
            addresses.append(await stack.enter_async_context(ctx))
        yield addresses


async def run_scenario(
    sc: Scenario,
    seconds: float,
    time_scale: float,
    seed: int,
    policies: tuple[Policy, ...] = DEFAULT_POLICIES,
    replicas: int = 1,
    virtual: bool = False,
) -> tuple[float, dict[str, RunResult]]:
    trace = sc.trace(seed)
    bound = bound_for(trace)
    out: dict[str, RunResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tenants_file = Path(tmp) / "tenants.yaml"
        tenants_file.write_text(_tenants_yaml(sc.weights))
        runs = [(p.label, p, trace) for p in policies]
        if sc.victim:
            solo = [a for a in trace if a.tenant == sc.victim]
            runs.append((SOLO, Policy("vtc"), solo))
        for label, policy, tr in runs:
            n = replicas if policy.name == "vtc" else 1
            common: dict[str, object] = {
                **policy.settings(),
                "kv_target_fraction": KV_TARGET_FRACTION,
                "tenants_file": str(tenants_file),
                "rate_limit_per_s": sum(load.shape.capacity_rps for load in sc.tenants.values())
                / len(sc.tenants) ** 2,
            }
            if virtual:
                del common["tenants_file"]  # the weights go in directly
                settings = Settings(**common, sim_model=MODEL, sim_seed=seed)  # type: ignore[arg-type]
                records = replay_virtual(tr, sc.weights, settings, seconds)
            else:
                async with _gateways(policy, n, common, time_scale, seed) as addresses:
                    affinity = sc.replica_of if sc.affinity else None
                    with collector_off():
                        records = await _replay(addresses, tr, time_scale, seconds, affinity)
            out[label] = analyse(sc, records, seconds, bound, label, n)
            print(f"  ran scenario {sc.key} / {label} on {n} replica(s): {len(records)} requests")
    return bound, out


def report(sc: Scenario, bound: float, results: dict[str, RunResult]) -> dict[str, Any]:
    """JSON-able report: per run, the summary and the ratios to FCFS and to the solo run."""
    fcfs = results.get("fcfs")
    fcfs_tps = fcfs.output_tokens_per_s if fcfs else math.nan
    fcfs_sps = fcfs.weighted_service_per_s if fcfs else math.nan
    fcfs_all = fcfs.tokens_per_s if fcfs else math.nan
    solo = results[SOLO].per_tenant.get(sc.victim) if SOLO in results else None
    runs: dict[str, Any] = {}
    for label, r in results.items():
        row = r.summary()
        row["throughput_over_fcfs"] = r.output_tokens_per_s / fcfs_tps if fcfs_tps else math.nan
        row["service_over_fcfs"] = r.weighted_service_per_s / fcfs_sps if fcfs_sps else math.nan
        row["tokens_over_fcfs"] = r.tokens_per_s / fcfs_all if fcfs_all else math.nan
        if sc.victim and sc.victim in r.per_tenant:
            v = r.per_tenant[sc.victim]
            row["victim_ttft_p50_s"] = v["ttft_p50_s"]
            row["victim_ttft_p99_s"] = v["ttft_p99_s"]
            if solo:
                row["victim_p50_over_solo"] = v["ttft_p50_s"] / solo["ttft_p50_s"]
                row["victim_p50_minus_solo_s"] = v["ttft_p50_s"] - solo["ttft_p50_s"]
                row["victim_p99_over_solo"] = v["ttft_p99_s"] / solo["ttft_p99_s"]
                # The additive form: what sharing the engine added to the tail, to set
                # beside one chunked-prefill step (the wait admission cannot remove).
                row["victim_p99_minus_solo_s"] = v["ttft_p99_s"] - solo["ttft_p99_s"]
        runs[label] = row
    return {
        "title": sc.title,
        "weights": sc.weights,
        "shapes": {t: load.shape.name for t, load in sc.tenants.items()},
        "bound_weighted_tokens": bound,
        "runs": runs,
    }


async def main(
    keys: str,
    seconds: float,
    time_scale: float,
    seed: int,
    policies: tuple[Policy, ...] = DEFAULT_POLICIES,
    replicas: int = 1,
    virtual: bool = False,
) -> dict[str, Any]:
    all_sc = scenarios(seconds)
    unknown = [k for k in keys if k not in all_sc]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown} (available: {''.join(all_sc)})")
    if virtual and replicas > 1:
        raise ValueError("--virtual replays one replica (the store runs the same rules)")
    if replicas > 1:
        policies = tuple(p for p in policies if p.name != "rate-limit")
    shapes = ", ".join(f"{s.name} ~{s.capacity_rps:g} req/s" for s in SHAPES.values())
    clock = "virtual (simulated time, no processes)" if virtual else f"time scale {time_scale:g}"
    print(
        f"fairness benchmark: {seconds:g} simulated s per run, {clock}, "
        f"seed {seed}, vtc on {replicas} replica(s); engine {MAX_RUNNING_REQUESTS} slots, "
        f"{M_TOKENS} KV tokens admitted at most (M); engine capacity per shape: {shapes}.\n"
        f"VTC bound = 2*max(w_in*L_in, w_out*M) + light credit, L_in the longest prompt sent"
        + (
            "; with replicas the Redis charge lag adds to it (not exposed, not included)"
            if replicas > 1
            else ""
        )
    )
    out: dict[str, Any] = {}
    for key in keys:
        bound, results = await run_scenario(
            all_sc[key], seconds, time_scale, seed, policies, replicas, virtual
        )
        out[key] = report(all_sc[key], bound, results)
        print_report(key, out[key])
    return out
