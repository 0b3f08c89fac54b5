"""Memory arithmetic of one GPU serving one model: weights, KV bytes per token,
KV capacity in tokens, and how many sessions fit.

The numbers come from the simulator's roofline cost model
(`service.engines.simulator.hardware`), so the planner and the simulated
engine agree by construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fairgate.bench.workload import Lengths
from service.engines.simulator.hardware import GIB, GPUS, MODELS, CostModel, GpuSpec, ModelSpec

# Bytes per element of the common precisions.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(DTYPE_BYTES)}") from None


# Tensor parallelism: each of N GPUs holds 1/N of the weights and of every
# token's KV, and all N stream and compute at once, so one engine sees N× the
# memory, bandwidth and FLOP/s, less the all-reduces (two per layer per step)
# and uneven shards. Assumed: 90 % of linear scaling with NVLink (A100, H100
# SXM, H200), 75 % over PCIe (RTX 4090, L40S, H100 PCIe).
TP_EFFICIENCY_NVLINK = 0.90
TP_EFFICIENCY_PCIE = 0.75
_NVLINK = frozenset({"a100-40gb", "a100-80gb", "h100-sxm", "h200"})


def tensor_parallel(gpu: GpuSpec, n: int, efficiency: float | None = None) -> GpuSpec:
    """N GPUs as one engine (tensor parallelism of degree n)."""
    if n < 1:
        raise ValueError("tensor parallelism must be >= 1")
    if n == 1:
        return gpu
    eff = efficiency
    if eff is None:
        eff = TP_EFFICIENCY_NVLINK if gpu.name in _NVLINK else TP_EFFICIENCY_PCIE
    return dataclasses.replace(
        gpu,
        name=f"{n}× {gpu.name} (TP{n})",
        memory_bytes=gpu.memory_bytes * n,
        bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s * n * eff,
        peak_flops_per_s=gpu.peak_flops_per_s * n * eff,
    )


def build_gpu(
    preset: str | None = "rtx-4090",
    *,
    memory_gib: float | None = None,
    bandwidth_gbps: float | None = None,
    tflops: float | None = None,
) -> GpuSpec:
    """A preset GPU, with any of its numbers overridden (GB/s and TFLOP/s are 1e9 and 1e12)."""
    if preset:
        if preset not in GPUS:
            raise ValueError(f"unknown GPU {preset!r}; presets: {', '.join(sorted(GPUS))}")
        gpu = GPUS[preset]
    else:
        if memory_gib is None or bandwidth_gbps is None or tflops is None:
            raise ValueError("a custom GPU needs memory (GiB), bandwidth (GB/s) and TFLOP/s")
        gpu = GpuSpec("custom", 0, 0.0, 0.0)
    changes: dict[str, object] = {}
    if memory_gib is not None:
        changes["memory_bytes"] = int(memory_gib * GIB)
    if bandwidth_gbps is not None:
        changes["bandwidth_bytes_per_s"] = bandwidth_gbps * 1e9
    if tflops is not None:
        changes["peak_flops_per_s"] = tflops * 1e12
    if changes and preset:
        changes["name"] = f"{preset} (modified)"
    return dataclasses.replace(gpu, **changes)  # type: ignore[arg-type]


def build_model(
    preset: str | None = "llama-3.1-8b-int4",
    *,
    params_b: float | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    max_context_tokens: int | None = None,
) -> ModelSpec:
    """A preset model, or a custom shape (`params_b` billions of parameters)."""
    if preset:
        if preset not in MODELS:
            raise ValueError(f"unknown model {preset!r}; presets: {', '.join(sorted(MODELS))}")
        model = MODELS[preset]
    else:
        if None in (params_b, layers, kv_heads, head_dim):
            raise ValueError("a custom model needs --params-b, --layers, --kv-heads, --head-dim")
        model = ModelSpec("custom", 0.0, 1, 1, 1, weight_bytes_per_param=2.0)
    changes: dict[str, object] = {}
    if params_b is not None:
        changes["params"] = params_b * 1e9
    for key, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value is not None:
            changes[key] = value
    if weight_dtype is not None:
        changes["weight_bytes_per_param"] = dtype_bytes(weight_dtype)
        changes["weight_overhead_bytes"] = 0.0
    if kv_dtype is not None:
        kv = dtype_bytes(kv_dtype)
        if kv != int(kv):
            raise ValueError("KV cache precision must be a whole number of bytes (fp16, fp8, ...)")
        changes["kv_bytes_per_element"] = int(kv)
    if max_context_tokens is not None:
        changes["max_context_tokens"] = max_context_tokens
    if changes and preset:
        changes["name"] = f"{preset} (modified)"
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Capacity:
    cost: CostModel
    usable_bytes: float
    kv_free_bytes: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    # Sessions whose whole context (prompt + output) fits at once.
    sessions_mean: int
    sessions_worst: int
    max_running_requests: int

    @property
    def sessions(self) -> int:
        return min(self.sessions_mean, self.max_running_requests)


def capacity(cost: CostModel, lengths: Lengths, max_running_requests: int = 256) -> Capacity:
    m = cost.model
    usable = cost.gpu.memory_bytes * cost.mem_fraction_static
    free = usable - m.weight_bytes - cost.reserve_bytes
    kv_tokens = cost.kv_capacity_tokens  # raises when the weights do not fit
    mean_ctx = lengths.mean_prompt + lengths.mean_output
    if lengths.trace:
        worst_ctx = max(p + o for p, o in lengths.trace.pairs)
    else:
        worst_ctx = lengths.prompt.max + lengths.output.max
    return Capacity(
        cost=cost,
        usable_bytes=usable,
        kv_free_bytes=free,
        kv_bytes_per_token=m.kv_bytes_per_token,
        kv_capacity_tokens=kv_tokens,
        sessions_mean=int(kv_tokens // mean_ctx),
        sessions_worst=int(kv_tokens // worst_ctx),
        max_running_requests=max_running_requests,
    )
