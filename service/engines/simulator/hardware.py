"""Roofline cost model of a GPU running a decoder-only model.

Assumptions (documented, to be replaced by fits to measured timings):
- Reachable memory bandwidth is ~80 % of peak, reachable tensor throughput ~55 %.
- Prefill of n tokens costs a fixed overhead + n * 2 * params FLOPs.
- A decode step for a batch costs max(memory time, compute time), where memory
  time = (weight bytes + sum of contexts * KV bytes per token) / bandwidth and
  compute time = tokens in the step * 2 * params / FLOP/s, plus a fixed launch
  overhead (CUDA graphs keep it near 1 ms).
- KV capacity = usable memory (mem_fraction_static, as SGLang) - weights -
  activation/graph reserve, divided by KV bytes per token.
Sanity: single-stream decode of Llama-3.1-8B fp16 on an RTX 4090 is ~20 ms per
token (~50 tok/s); 4-bit weights bring it to ~7-8 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    bandwidth_efficiency: float = 0.80
    flops_efficiency: float = 0.55

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth_bytes_per_s * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.peak_flops_per_s * self.flops_efficiency


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float
    kv_bytes_per_element: int = 2
    max_context_tokens: int = 32768
    # Extra weight bytes beyond params * bytes (quantization scales, embeddings kept in fp16).
    weight_overhead_bytes: float = 0.0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_param + self.weight_overhead_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, per layer, per KV head, per head dimension.
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.params


class DoesNotFit(ValueError):
    """The weights and the reserve leave no memory for the KV cache; the message
    gives the sizes and the next steps (`hint` adds one, e.g. a command's flag)."""

    def __init__(self, cost: CostModel, hint: str = "") -> None:
        m, g = cost.model, cost.gpu
        usable = g.memory_bytes * cost.mem_fraction_static
        super().__init__(
            f"{m.name} does not fit in {g.name}: weights {m.weight_bytes / 1e9:.1f} GB + "
            f"reserve {cost.reserve_bytes / 1e9:.1f} GB need more than the "
            f"{usable / 1e9:.1f} GB usable ({cost.mem_fraction_static:.0%} of "
            f"{g.memory_bytes / GIB:.0f} GiB), leaving nothing for the KV cache "
            f"({m.kv_bytes_per_token / 1024:.0f} KiB per token); {hint}use a smaller or "
            "quantized model (fp8, int4), or a GPU with more memory"
        )


@dataclass(frozen=True, slots=True)
class CostModel:
    gpu: GpuSpec
    model: ModelSpec
    mem_fraction_static: float = 0.88
    # Activations, CUDA graphs, allocator slack.
    reserve_bytes: float = 2.0e9
    prefill_overhead_s: float = 0.004
    step_overhead_s: float = 0.001

    @property
    def kv_capacity_tokens(self) -> int:
        usable = self.gpu.memory_bytes * self.mem_fraction_static
        free = usable - self.model.weight_bytes - self.reserve_bytes
        if free <= 0:
            raise DoesNotFit(self)
        return int(free // self.model.kv_bytes_per_token)

    def prefill_s(self, tokens: int) -> float:
        return (
            self.prefill_overhead_s + tokens * self.model.flops_per_token / self.gpu.effective_flops
        )

    def step_s(self, prefill_tokens: int, decode_batch: int, context_tokens: int) -> float:
        """One engine iteration: a chunk of prefill plus one decode token per running request."""
        if prefill_tokens == 0 and decode_batch == 0:
            return 0.0
        mem_bytes = self.model.weight_bytes + context_tokens * self.model.kv_bytes_per_token
        memory_s = mem_bytes / self.gpu.effective_bandwidth
        compute_s = (
            (prefill_tokens + decode_batch) * self.model.flops_per_token / self.gpu.effective_flops
        )
        overhead_s = self.step_overhead_s + (self.prefill_overhead_s if prefill_tokens else 0.0)
        return overhead_s + max(memory_s, compute_s)


MIB = 1024**2

# Datasheet numbers: memory (as nvidia-smi reports it), peak memory bandwidth,
# dense fp16/bf16 tensor peak (no sparsity).
RTX_4090 = GpuSpec(
    name="rtx-4090",
    memory_bytes=24 * GIB,
    bandwidth_bytes_per_s=1008e9,
    peak_flops_per_s=165e12,
)
A100_40GB = GpuSpec("a100-40gb", 40960 * MIB, 1555e9, 312e12)
A100_80GB = GpuSpec("a100-80gb", 81920 * MIB, 2039e9, 312e12)
L40S = GpuSpec("l40s", 46068 * MIB, 864e9, 362e12)
H100_PCIE = GpuSpec("h100-pcie", 81559 * MIB, 2000e9, 756e12)
H100_SXM = GpuSpec("h100-sxm", 81559 * MIB, 3350e9, 989e12)
H200 = GpuSpec("h200", 143771 * MIB, 4800e9, 989e12)

_LLAMA_31_8B = dict(params=8.03e9, layers=32, kv_heads=8, head_dim=128, max_context_tokens=32768)

LLAMA_31_8B_FP16 = ModelSpec(name="llama-3.1-8b-fp16", weight_bytes_per_param=2.0, **_LLAMA_31_8B)  # type: ignore[arg-type]
# AWQ/GPTQ 4-bit: ~0.5 B/param for the linear layers; embeddings and the LM
# head stay fp16 (~1.7 GB), giving ~5.7 GB of weights in all.
LLAMA_31_8B_INT4 = ModelSpec(
    name="llama-3.1-8b-int4",
    weight_bytes_per_param=0.5,
    weight_overhead_bytes=1.7e9,
    **_LLAMA_31_8B,  # type: ignore[arg-type]
)
QWEN_25_7B_INT4 = ModelSpec(
    name="qwen2.5-7b-int4",
    params=7.6e9,
    layers=28,
    kv_heads=4,
    head_dim=128,
    weight_bytes_per_param=0.5,
    weight_overhead_bytes=1.1e9,
    max_context_tokens=32768,
)

LLAMA_31_8B_FP8 = ModelSpec(name="llama-3.1-8b-fp8", weight_bytes_per_param=1.0, **_LLAMA_31_8B)  # type: ignore[arg-type]
# Llama-3.1-70B: 80 layers, 8 KV heads (GQA), head dim 128 → 320 KiB of fp16
# KV per token. Quantized variants keep the embeddings and LM head (128256 ×
# 8192 each) in 16 bits: ~2.1 GB.
_LLAMA_31_70B: dict[str, Any] = dict(
    params=70.6e9, layers=80, kv_heads=8, head_dim=128, max_context_tokens=131072
)
LLAMA_31_70B_FP16 = ModelSpec(
    name="llama-3.1-70b-fp16", weight_bytes_per_param=2.0, **_LLAMA_31_70B
)
LLAMA_31_70B_FP8 = ModelSpec(
    name="llama-3.1-70b-fp8",
    weight_bytes_per_param=1.0,
    weight_overhead_bytes=2.1e9,
    **_LLAMA_31_70B,
)
LLAMA_31_70B_INT4 = ModelSpec(
    name="llama-3.1-70b-int4",
    weight_bytes_per_param=0.5,
    weight_overhead_bytes=3.2e9,
    **_LLAMA_31_70B,
)
QWEN_25_72B_INT4 = ModelSpec(
    name="qwen2.5-72b-int4",
    params=72.7e9,
    layers=80,
    kv_heads=8,
    head_dim=128,
    weight_bytes_per_param=0.5,
    weight_overhead_bytes=3.3e9,
    max_context_tokens=131072,
)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        LLAMA_31_8B_FP16,
        LLAMA_31_8B_FP8,
        LLAMA_31_8B_INT4,
        QWEN_25_7B_INT4,
        LLAMA_31_70B_FP16,
        LLAMA_31_70B_FP8,
        LLAMA_31_70B_INT4,
        QWEN_25_72B_INT4,
    )
}
GPUS: dict[str, GpuSpec] = {
    g.name: g for g in (RTX_4090, L40S, A100_40GB, A100_80GB, H100_PCIE, H100_SXM, H200)
}


def preset(gpu: str = "rtx-4090", model: str = "llama-3.1-8b-int4") -> CostModel:
    try:
        return CostModel(gpu=GPUS[gpu], model=MODELS[model])
    except KeyError as exc:
        raise ValueError(
            f"unknown preset {gpu}/{model}; gpus: {sorted(GPUS)}, models: {sorted(MODELS)}"
        ) from exc
