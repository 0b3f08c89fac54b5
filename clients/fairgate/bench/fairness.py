"""`fairgate bench fairness`: the same arrival trace through each queue policy.

For each scenario, a fairgate server (child process; simulated RTX 4090,
time-scaled) runs once per policy and replays the same seeded trace; the
client measures per-tenant service, TTFT and rejections, then prints the
policies side by side. Times are in simulated seconds.

Scenarios (256-token prompts, 256-token outputs):
  a  two tenants overloading at request rates 1:2 (the VTC paper's suite)
  b  a victim at a modest rate beside a tenant flooding at 10x capacity
     (plus the victim alone, for its solo TTFT)
  c  weights 1:2:4, all backlogged
  d  an on/off tenant beside a steady one (idle time earns no credit)
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fairgate.bench.common import percentile, server_process
from fairgate.bench.fairness_metrics import (
    RequestRecord,
    backlog_intervals,
    jain_index,
    max_weighted_gap,
    service_events,
)
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

W_IN, W_OUT = 1.0, 2.0
PROMPT, OUTPUT = 256, 256
# A small engine so that overload is cheap to produce on a 2-core host:
# 32 running requests, 20k KV tokens (admission target 90 % of it).
ENGINE = {
    "sim_max_running_requests": 32,
    "sim_kv_capacity_tokens": 20000,
    "kv_target_fraction": 0.9,
    "sim_model": "llama-3.1-8b-int4",
}
M_TOKENS = int(20000 * 0.9)
# Measured capacity of that engine with this request shape is ~8 requests/s.
CAPACITY_RPS = 8.0
POLICIES = ("fcfs", "rate-limit", "vtc")


@dataclass
class Scenario:
    key: str
    title: str
    weights: dict[str, float]
    # tenant -> list of (start_s, end_s, requests/s) phases
    phases: dict[str, list[tuple[float, float, float]]]
    victim: str = ""

    def trace(self, seed: int) -> list[tuple[float, str]]:
        rng = random.Random(seed)
        out: list[tuple[float, str]] = []
        for tenant, phases in self.phases.items():
            for start, end, rate in phases:
                t = start + rng.expovariate(rate)
                while t < end:
                    out.append((t, tenant))
                    t += rng.expovariate(rate)
        return sorted(out)


def scenarios(seconds: float) -> dict[str, Scenario]:
    c, s = CAPACITY_RPS, seconds
    on_off = [(start, min(start + s / 6, s), 1.5 * c) for start in (0.0, s / 3, 2 * s / 3)]
    return {
        "a": Scenario(
            "a",
            "two tenants overloading at rates 1:2",
            {"t1": 1, "t2": 1},
            {"t1": [(0, s, 0.75 * c)], "t2": [(0, s, 1.5 * c)]},
        ),
        "b": Scenario(
            "b",
            "victim at 1/8 capacity beside a 10x flood",
            {"victim": 1, "flood": 1},
            {"victim": [(0, s, c / 8)], "flood": [(0, s, 10 * c)]},
            victim="victim",
        ),
        "c": Scenario(
            "c",
            "weights 1:2:4, all backlogged",
            {"w1": 1, "w2": 2, "w4": 4},
            {"w1": [(0, s, c)], "w2": [(0, s, c)], "w4": [(0, s, c)]},
        ),
        "d": Scenario(
            "d",
            "on/off tenant beside a steady one",
            {"steady": 1, "onoff": 1},
            {"steady": [(0, s, 1.5 * c)], "onoff": on_off},
        ),
    }


@dataclass
class RunResult:
    records: list[RequestRecord]
    window_s: float
    per_tenant: dict[str, dict[str, float]] = field(default_factory=dict)
    gap_over_bound: float = 0.0
    jain: float = math.nan
    output_tokens_per_s: float = 0.0


async def _replay(
    address: str, trace: list[tuple[float, str]], time_scale: float, window_s: float
) -> list[RequestRecord]:
    loop = asyncio.get_running_loop()
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    stubs = [pb_grpc.InferenceServiceStub(ch) for ch in channels]
    await asyncio.gather(*(s.ListModels(pb.ListModelsRequest()) for s in stubs))
    req_proto = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[17] * PROMPT),
        return_token_ids=True,
        sampling=pb.SamplingParams(max_tokens=OUTPUT, ignore_eos=True),
    )
    t0 = loop.time()

    def now_s() -> float:  # simulated seconds since the start
        return (loop.time() - t0) / time_scale

    async def one(i: int, rec: RequestRecord) -> None:
        call = stubs[i % len(stubs)].Generate(
            req_proto, metadata=(("x-fairgate-tenant", rec.tenant),)
        )
        try:
            async for msg in call:
                t = now_s()
                if msg.HasField("delta"):
                    if rec.first_token_s is None:
                        rec.first_token_s = t
                    rec.token_times.append((t, len(msg.delta.token_ids)))
                else:
                    rec.done_s = t
                    wait = msg.result.timings.queue_wait.ToNanoseconds() / 1e9 / time_scale
                    rec.admitted_s = rec.sent_s + wait
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                rec.rejected = exc.code().name

    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []
    for i, (t, tenant) in enumerate(trace):
        delay = t0 + t * time_scale - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = RequestRecord(tenant=tenant, sent_s=now_s(), prompt_tokens=PROMPT)
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


def _analyse(sc: Scenario, records: list[RequestRecord], window_s: float) -> RunResult:
    res = RunResult(records, window_s)
    events = service_events(records, W_IN, W_OUT, window_s)
    intervals = {t: backlog_intervals(records, t, window_s) for t in sc.weights}
    bound = 2 * max(W_IN * PROMPT, W_OUT * M_TOKENS)
    tenants = list(sc.weights)
    gaps = [
        max_weighted_gap(events, intervals, sc.weights, f, g)
        for i, f in enumerate(tenants)
        for g in tenants[i + 1 :]
    ]
    res.gap_over_bound = max(gaps, default=0.0) / bound
    weighted = []
    total_out = 0
    for t in tenants:
        mine = [r for r in records if r.tenant == t]
        out_tokens = sum(n for r in mine for tt, n in r.token_times if tt <= window_s)
        total_out += out_tokens
        service = sum(v for _, v in events.get(t, []))
        weighted.append(service / sc.weights[t])
        # Requests never served in the window count with a censored TTFT (a lower bound).
        ttfts = [
            r.ttft_s if r.ttft_s is not None else window_s - r.sent_s
            for r in mine
            if not r.rejected
        ]
        res.per_tenant[t] = {
            "sent": len(mine),
            "rejected": sum(1 for r in mine if r.rejected),
            "output_tokens": out_tokens,
            "weighted_service": service / sc.weights[t],
            "ttft_p50": percentile(ttfts, 50),
            "ttft_p99": percentile(ttfts, 99),
        }
    res.jain = jain_index(weighted)
    res.output_tokens_per_s = total_out / window_s
    return res


def _tenants_yaml(weights: dict[str, float]) -> str:
    lines = ["tenants:"]
    for t, w in weights.items():
        lines += [f"  - id: {t}", f"    weight: {w}"]
    return "\n".join(lines) + "\n"


async def run_scenario(
    sc: Scenario, seconds: float, time_scale: float, seed: int, policies: tuple[str, ...] = POLICIES
) -> dict[str, RunResult]:
    trace = sc.trace(seed)
    out: dict[str, RunResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tenants_file = Path(tmp) / "tenants.yaml"
        tenants_file.write_text(_tenants_yaml(sc.weights))
        runs: list[tuple[str, str, list[tuple[float, str]]]] = [(p, p, trace) for p in policies]
        if sc.victim:
            runs.append(("victim solo", "vtc", [a for a in trace if a[1] == sc.victim]))
        for label, policy, tr in runs:
            # The baselines run as the engine would alone: no fair-share reserve.
            reserve = {} if policy == "vtc" else {"fair_reserve_fraction": 0}
            settings = {
                **ENGINE,
                **reserve,
                "policy": policy,
                "tenants_file": str(tenants_file),
                "sim_time_scale": time_scale,
                "sim_seed": seed,
                "rate_limit_per_s": CAPACITY_RPS / len(sc.weights),
            }
            async with server_process("fairgate", **settings) as address:
                records = await _replay(address, tr, time_scale, seconds)
            out[label] = _analyse(sc, records, seconds)
            print(f"  ran scenario {sc.key} / {label}: {len(records)} requests", flush=True)
    return out


def _print(sc: Scenario, results: dict[str, RunResult]) -> None:
    fcfs_tps = results["fcfs"].output_tokens_per_s if "fcfs" in results else math.nan
    print(f"\n({sc.key}) {sc.title}  [weights {sc.weights}]")
    print(
        f"{'policy':>12} | {'tenant':>7} | {'sent':>5} | {'rejected':>8} | {'out tokens':>10} | "
        f"{'w.service':>9} | {'TTFT p50 s':>10} | {'TTFT p99 s':>10} | {'gap/bound':>9} | "
        f"{'Jain':>5} | {'tput/FCFS':>9}"
    )
    for label, r in results.items():
        for i, (t, row) in enumerate(r.per_tenant.items()):
            head = (
                (
                    f"{label:>12}",
                    f"{r.gap_over_bound:>9.3f}",
                    f"{r.jain:>5.3f}",
                    f"{r.output_tokens_per_s / fcfs_tps:>9.2f}",
                )
                if i == 0
                else ("", "", "", "")
            )
            if label == "victim solo" and t != sc.victim:
                continue
            print(
                f"{head[0]:>12} | {t:>7} | {row['sent']:>5.0f} | {row['rejected']:>8.0f} | "
                f"{row['output_tokens']:>10.0f} | {row['weighted_service']:>9.0f} | "
                f"{row['ttft_p50']:>10.3f} | {row['ttft_p99']:>10.3f} | {head[1]:>9} | "
                f"{head[2]:>5} | {head[3]:>9}"
            )
    if sc.victim and "victim solo" in results and "vtc" in results:
        solo = results["victim solo"].per_tenant[sc.victim]["ttft_p99"]
        for p in ("fcfs", "rate-limit", "vtc"):
            if p in results:
                ratio = results[p].per_tenant[sc.victim]["ttft_p99"] / solo
                print(f"    victim TTFT p99 under {p}: {ratio:.2f}x its solo run")


async def main(keys: str, seconds: float, time_scale: float, seed: int) -> None:
    all_sc = scenarios(seconds)
    bound = 2 * max(W_IN * PROMPT, W_OUT * M_TOKENS)
    print(
        f"fairness benchmark: {seconds:g} simulated s per run, time scale {time_scale:g}, "
        f"seed {seed}; VTC bound 2*max(w_in*L_in, w_out*M) = {bound:.0f} weighted tokens "
        f"(M = {M_TOKENS} KV tokens admitted at most)"
    )
    for key in keys:
        sc = all_sc[key]
        _print(sc, await run_scenario(sc, seconds, time_scale, seed))
