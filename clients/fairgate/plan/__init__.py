"""`fairgate plan`: capacity planning for one GPU serving one model.

`make_plan` does the arithmetic (KV capacity, sessions that fit, a roofline
rate estimate) and the simulator search (highest arrival rate meeting the p99
SLOs); every step is recorded as a line of reasoning that the CLI prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fairgate.bench.workload import Lengths
from fairgate.plan.capacity import Capacity, capacity
from fairgate.plan.search import Probe, SearchResult, Slos, Workload, max_rate, simulate
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import GIB, CostModel

__all__ = ["Plan", "PlanInputs", "make_plan", "plan_to_dict"]


@dataclass(frozen=True, slots=True)
class PlanInputs:
    cost: CostModel
    lengths: Lengths
    slos: Slos
    cv: float = 1.0
    headroom: float = 0.2
    max_running_requests: int = 256
    chunked_prefill_tokens: int = 2048
    requests_per_probe: int = 800
    seed: int = 0
    # An expected arrival rate to check against the plan (requests/s).
    expected_rate_per_s: float | None = None


@dataclass(slots=True)
class Plan:
    inputs: PlanInputs
    capacity: Capacity
    roofline_rate_per_s: float
    search: SearchResult
    recommended_rate_per_s: float
    at_recommended: Probe | None
    at_expected: Probe | None
    lines: list[str] = field(default_factory=list)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB ({n / GIB:.2f} GiB)"


def make_plan(inputs: PlanInputs, say: Callable[[str], None] | None = None) -> Plan:
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    cost, lengths, slos = inputs.cost, inputs.lengths, inputs.slos
    gpu, m = cost.gpu, cost.model
    out(
        f"1. GPU {gpu.name}: {_gb(gpu.memory_bytes)} memory, "
        f"{gpu.bandwidth_bytes_per_s / 1e9:.0f} GB/s × {gpu.bandwidth_efficiency:.0%} reachable"
        f" = {gpu.effective_bandwidth / 1e9:.0f} GB/s, {gpu.peak_flops_per_s / 1e12:.0f} TFLOP/s"
        f" × {gpu.flops_efficiency:.0%} = {gpu.effective_flops / 1e12:.1f} TFLOP/s."
    )
    out(
        f"2. Model {m.name}: {m.params / 1e9:.2f} B params × {m.weight_bytes_per_param:g} B"
        + (f" + {m.weight_overhead_bytes / 1e9:.2f} GB overhead" if m.weight_overhead_bytes else "")
        + f" = {_gb(m.weight_bytes)} of weights."
    )
    out(
        f"3. KV per token = 2 (K,V) × {m.layers} layers × {m.kv_heads} KV heads × {m.head_dim}"
        f" head dim × {m.kv_bytes_per_element} B = {m.kv_bytes_per_token} B"
        f" ({m.kv_bytes_per_token / 1024:g} KiB)."
    )
    cap = capacity(cost, lengths, inputs.max_running_requests)
    out(
        f"4. KV capacity = ({_gb(gpu.memory_bytes)} × {cost.mem_fraction_static:g} usable"
        f" − {m.weight_bytes / 1e9:.2f} GB weights − {cost.reserve_bytes / 1e9:.2f} GB reserve)"
        f" / {m.kv_bytes_per_token} B = {cap.kv_free_bytes / 1e9:.2f} GB / "
        f"{m.kv_bytes_per_token} B = {cap.kv_capacity_tokens:,} tokens."
    )
    mean_ctx = lengths.mean_prompt + lengths.mean_output
    out(
        f"5. Traffic: {lengths.describe()}; a session holds up to {mean_ctx:.0f} tokens on"
        f" average → {cap.sessions_mean} concurrent sessions fit ({cap.sessions_worst} at the"
        f" longest lengths); the engine runs at most {inputs.max_running_requests} →"
        f" {cap.sessions} sessions."
    )
    batch = max(1, cap.sessions)
    decode_ctx = lengths.mean_prompt + lengths.mean_output / 2
    step_1 = cost.step_s(0, 1, int(decode_ctx))
    step_b = cost.step_s(0, batch, int(batch * decode_ctx))
    prefill_s = cost.prefill_s(int(lengths.mean_prompt))
    out(
        f"6. Roofline: one decode step takes {step_1 * 1e3:.1f} ms alone and"
        f" {step_b * 1e3:.1f} ms at batch {batch} ({batch / step_b:,.0f} output tokens/s);"
        f" a {lengths.mean_prompt:.0f}-token prefill takes {prefill_s * 1e3:.1f} ms alone."
    )
    per_request_s = (
        lengths.mean_output * step_b / batch
        + lengths.mean_prompt * m.flops_per_token / gpu.effective_flops
    )
    roofline_rate = 1.0 / per_request_s
    out(
        f"7. Throughput bound ≈ 1 / ({lengths.mean_output:.0f} tokens × {step_b * 1e3:.1f} ms /"
        f" {batch} + prefill compute) = {roofline_rate:.2f} requests/s (ignores queueing and"
        " latency SLOs)."
    )
    config = SimConfig(
        cost=cost,
        max_running_requests=inputs.max_running_requests,
        chunked_prefill_size=inputs.chunked_prefill_tokens,
        seed=inputs.seed,
    )
    workload = Workload(lengths, cv=inputs.cv, requests=inputs.requests_per_probe, seed=inputs.seed)
    arrivals = "Poisson" if inputs.cv == 1 else f"gamma arrivals with CV {inputs.cv:g}"
    out(
        f"8. Search with the simulator ({inputs.requests_per_probe} requests per probe,"
        f" {arrivals}, virtual clock): SLO TTFT p99 ≤ {slos.ttft_p99_s * 1e3:g} ms,"
        f" TPOT p99 ≤ {slos.tpot_p99_s * 1e3:g} ms."
    )

    def on_probe(why: str, p: Probe) -> None:
        out(
            f"   {p.rate_per_s:8.3f} req/s: TTFT p99 {p.ttft_p99_s * 1e3:9.1f} ms, TPOT p99"
            f" {p.tpot_p99_s * 1e3:7.2f} ms, preemptions {p.preemptions:4d} →"
            f" {'meets' if p.meets else 'misses'}  ({why})"
        )

    result = max_rate(config, workload, slos, roofline_rate, on_probe=on_probe)
    plan = Plan(inputs, cap, roofline_rate, result, 0.0, None, None, lines)
    if not result.feasible:
        out(
            "9. Even a light load misses the SLOs: the latency targets are below what this GPU"
            " and model can do for these lengths (see the single-request numbers in 6)."
        )
    else:
        plan.recommended_rate_per_s = result.max_rate_per_s * (1 - inputs.headroom)
        plan.at_recommended = simulate(config, workload, plan.recommended_rate_per_s, slos)
        rec = plan.at_recommended
        out(
            f"9. Highest rate meeting the SLOs: {result.max_rate_per_s:.2f} requests/s"
            f" ({result.max_rate_per_s * lengths.mean_output:,.0f} output tokens/s). With"
            f" {inputs.headroom:.0%} headroom, plan for {plan.recommended_rate_per_s:.2f}"
            f" requests/s per engine ({gpu.name}): TTFT p99 {rec.ttft_p99_s * 1e3:.1f} ms, TPOT p99"
            f" {rec.tpot_p99_s * 1e3:.2f} ms, ~{plan.recommended_rate_per_s * rec.e2e_mean_s:.0f}"
            " requests in flight (Little's law)."
        )
    if inputs.expected_rate_per_s is not None:
        exp = simulate(config, workload, inputs.expected_rate_per_s, slos)
        plan.at_expected = exp
        gpus = (
            inputs.expected_rate_per_s / plan.recommended_rate_per_s
            if plan.recommended_rate_per_s
            else float("inf")
        )
        out(
            f"10. At the expected {inputs.expected_rate_per_s:g} requests/s one engine gives TTFT"
            f" p99 {exp.ttft_p99_s * 1e3:.1f} ms, TPOT p99 {exp.tpot_p99_s * 1e3:.2f} ms →"
            f" {'meets' if exp.meets else 'misses'} the SLOs; engines needed with headroom:"
            f" {gpus:.2f} → {max(1, -(-gpus // 1)):.0f}."
        )
    return plan


def _probe(p: Probe | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "rate_per_s": p.rate_per_s,
        "ttft_p99_ms": p.ttft_p99_s * 1e3,
        "tpot_p99_ms": p.tpot_p99_s * 1e3,
        "e2e_mean_ms": p.e2e_mean_s * 1e3,
        "preemptions": p.preemptions,
        "meets_slos": p.meets,
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan for scripts (`fairgate plan --json`): inputs, numbers, probes, reasoning."""
    inp, cap = plan.inputs, plan.capacity
    gpu, m = inp.cost.gpu, inp.cost.model
    return {
        "gpu": {
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "effective_bandwidth_bytes_per_s": gpu.effective_bandwidth,
            "effective_flops_per_s": gpu.effective_flops,
        },
        "model": {
            "name": m.name,
            "params": m.params,
            "weight_bytes": m.weight_bytes,
            "kv_bytes_per_token": m.kv_bytes_per_token,
        },
        "traffic": inp.lengths.describe(),
        "slos": {
            "ttft_p99_ms": inp.slos.ttft_p99_s * 1e3,
            "tpot_p99_ms": inp.slos.tpot_p99_s * 1e3,
        },
        "kv_capacity_tokens": cap.kv_capacity_tokens,
        "sessions_that_fit": cap.sessions,
        "roofline_rate_per_s": plan.roofline_rate_per_s,
        "feasible": plan.search.feasible,
        "max_rate_per_s": plan.search.max_rate_per_s,
        "headroom": inp.headroom,
        "recommended_rate_per_s": plan.recommended_rate_per_s,
        "at_recommended": _probe(plan.at_recommended),
        "expected_rate_per_s": inp.expected_rate_per_s,
        "at_expected": _probe(plan.at_expected),
        "probes": [_probe(p) for p in plan.search.probes],
        "steps": plan.lines,
    }
