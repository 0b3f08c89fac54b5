"""The typer command behind `fairgate plan` (registered in cli/main.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer


def _presets(kind: str) -> str:
    from service.engines.simulator.hardware import GPUS, MODELS

    return ", ".join(GPUS if kind == "gpu" else MODELS)


def plan_command(
    gpu: Annotated[
        str,
        typer.Option(
            help=f"GPU preset ({_presets('gpu')}); 'custom' needs the three --gpu-* numbers"
        ),
    ] = "rtx-4090",
    tp: Annotated[
        int,
        typer.Option(
            "--tp",
            "--tensor-parallel",
            help="GPUs per engine (tensor parallelism): memory, bandwidth and FLOP/s × N at "
            "90 % (NVLink) or 75 % (PCIe) efficiency",
        ),
    ] = 1,
    gpu_memory_gib: Annotated[float | None, typer.Option(help="GPU memory (GiB)")] = None,
    gpu_bandwidth_gbps: Annotated[
        float | None, typer.Option(help="memory bandwidth (GB/s)")
    ] = None,
    gpu_tflops: Annotated[
        float | None, typer.Option(help="dense fp16 tensor peak (TFLOP/s)")
    ] = None,
    model: Annotated[
        str,
        typer.Option(help=f"model preset ({_presets('model')}); 'custom' needs the shape flags"),
    ] = "llama-3.1-8b-int4",
    params_b: Annotated[float | None, typer.Option(help="parameters (billions)")] = None,
    layers: Annotated[int | None, typer.Option()] = None,
    kv_heads: Annotated[int | None, typer.Option()] = None,
    head_dim: Annotated[int | None, typer.Option()] = None,
    weight_dtype: Annotated[str | None, typer.Option(help="fp16|bf16|fp8|int8|int4")] = None,
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache precision: fp16|bf16|fp8")] = None,
    max_context: Annotated[int | None, typer.Option(help="model context window")] = None,
    mem_fraction: Annotated[float, typer.Option(help="usable share of GPU memory")] = 0.88,
    reserve_gib: Annotated[float, typer.Option(help="activations/graphs reserve (GB)")] = 2.0,
    max_running: Annotated[int, typer.Option(help="engine's max running requests")] = 256,
    prompt_tokens: Annotated[str, typer.Option(help="prompt length: N or LO-HI")] = "256",
    output_tokens: Annotated[str, typer.Option(help="output length: N or LO-HI")] = "256",
    trace: Annotated[Path | None, typer.Option(help="JSONL with prompt/output tokens")] = None,
    cv: Annotated[float, typer.Option(help="arrival burstiness: CV of gaps (1 = Poisson)")] = 1.0,
    rate: Annotated[float | None, typer.Option(help="expected arrival rate to check")] = None,
    slo_ttft_p99_ms: Annotated[float, typer.Option(help="SLO: p99 time to first token")] = 1000,
    slo_tpot_p99_ms: Annotated[float, typer.Option(help="SLO: p99 time per output token")] = 100,
    headroom: Annotated[float, typer.Option(help="fraction kept in reserve, e.g. 0.2")] = 0.2,
    requests: Annotated[int, typer.Option(help="simulated requests per probe")] = 800,
    seed: Annotated[int, typer.Option()] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the plan as JSON (the reasoning under `steps`)")
    ] = False,
) -> None:
    """Capacity plan: KV capacity, sessions that fit, highest rate meeting the SLOs."""
    from fairgate.bench.workload import Lengths, Trace, parse_length
    from fairgate.plan import PlanInputs, make_plan, plan_to_dict
    from fairgate.plan.capacity import build_gpu, build_model, tensor_parallel
    from fairgate.plan.search import Slos
    from service.engines.simulator.hardware import CostModel, DoesNotFit

    try:
        one_gpu = build_gpu(
            None if gpu == "custom" else gpu,
            memory_gib=gpu_memory_gib,
            bandwidth_gbps=gpu_bandwidth_gbps,
            tflops=gpu_tflops,
        )
        gpu_spec = tensor_parallel(
            one_gpu,
            tp,
        )
        model_spec = build_model(
            None if model == "custom" else model,
            params_b=params_b,
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            max_context_tokens=max_context,
        )
        # Each GPU of a tensor-parallel group keeps its own activations reserve.
        cost = CostModel(
            gpu_spec,
            model_spec,
            mem_fraction_static=mem_fraction,
            reserve_bytes=reserve_gib * 1e9 * tp,
        )
        try:
            cost.kv_capacity_tokens  # noqa: B018  (raises when the weights do not fit)
        except DoesNotFit:
            # The fewest GPUs (a power of two, as TP groups go) whose memory holds it.
            room = one_gpu.memory_bytes * mem_fraction - reserve_gib * 1e9
            need = model_spec.weight_bytes / room if room > 0 else float("inf")
            hint = ""
            if need < 64:
                n = 1 << math.ceil(math.log2(math.floor(need) + 1))
                hint = f"split it over {n} GPUs (--tp {n}), " if n > tp else ""
            raise DoesNotFit(cost, hint) from None
        if not 0 <= headroom < 1:
            raise ValueError("headroom must be in [0, 1)")
        if cv <= 0 or requests < 20:
            raise ValueError("cv must be > 0 and requests >= 20")
        inputs = PlanInputs(
            cost=cost,
            lengths=Lengths(
                parse_length(prompt_tokens),
                parse_length(output_tokens),
                trace=Trace.load(trace) if trace else None,
            ),
            slos=Slos(slo_ttft_p99_ms / 1e3, slo_tpot_p99_ms / 1e3),
            cv=cv,
            headroom=headroom,
            max_running_requests=max_running,
            requests_per_probe=requests,
            seed=seed,
            expected_rate_per_s=rate,
        )
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        import json

        typer.echo(json.dumps(plan_to_dict(make_plan(inputs)), indent=2))
    else:
        make_plan(inputs, say=typer.echo)
