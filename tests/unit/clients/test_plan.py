"""`fairgate plan`: KV arithmetic against hand-computed values, and the rate search."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fairgate.bench.workload import Fixed, Lengths, Uniform
from fairgate.plan import PlanInputs, make_plan
from fairgate.plan.capacity import build_gpu, build_model, capacity
from fairgate.plan.search import Slos, Workload, max_rate, simulate

from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import CostModel

GIB = 1024**3
# RTX 4090 (24 GiB) × 0.88 usable, as SGLang's mem_fraction_static.
USABLE_4090 = 24 * GIB * 0.88  # 22,677,427,077.12 B


def test_llama_8b_fp16_on_4090() -> None:
    cost = CostModel(build_gpu("rtx-4090"), build_model("llama-3.1-8b-fp16"))
    assert cost.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert cost.model.weight_bytes == 8.03e9 * 2
    # (22,677,427,077 - 16,060,000,000 weights - 2e9 reserve) // 131072
    cap = capacity(cost, Lengths(Fixed(1000), Fixed(1000)))
    assert cap.kv_capacity_tokens == 35228 == int((USABLE_4090 - 16.06e9 - 2e9) // 131072)
    assert cap.sessions_mean == 17  # 35228 // 2000 tokens per session


def test_qwen_7b_int4_and_fp8_kv() -> None:
    model = build_model("qwen2.5-7b-int4")
    assert model.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    cost = CostModel(build_gpu("rtx-4090"), model)
    # weights 7.6e9 × 0.5 + 1.1e9 = 4.9e9
    cap = capacity(cost, Lengths(Fixed(512), Uniform(128, 512)), max_running_requests=256)
    assert cap.kv_capacity_tokens == 275136 == int((USABLE_4090 - 4.9e9 - 2e9) // 57344)
    assert cap.sessions_mean == 275136 // 832 and cap.sessions_worst == 275136 // 1024
    assert cap.sessions == 256  # capped by the engine's running limit
    fp8 = build_model("qwen2.5-7b-int4", kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == 57344 // 2


def test_custom_gpu_and_model() -> None:
    gpu = build_gpu(None, memory_gib=80, bandwidth_gbps=2000, tflops=300)
    assert (gpu.memory_bytes, gpu.bandwidth_bytes_per_s, gpu.peak_flops_per_s) == (
        80 * GIB,
        2000e9,
        300e12,
    )
    # A Mistral-7B-like shape in fp16 with an fp8 KV cache.
    model = build_model(
        None,
        params_b=7.24,
        layers=32,
        kv_heads=8,
        head_dim=128,
        weight_dtype="fp16",
        kv_dtype="fp8",
    )
    assert model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1 == 65536
    cap = capacity(CostModel(gpu, model), Lengths(Fixed(100), Fixed(100)))
    assert cap.kv_capacity_tokens == int((80 * GIB * 0.88 - 14.48e9 - 2e9) // 65536)
    with pytest.raises(ValueError):
        build_gpu(None, memory_gib=80)
    with pytest.raises(ValueError):
        build_model(None, params_b=7)
    with pytest.raises(ValueError, match="does not fit"):
        capacity(
            CostModel(build_gpu("rtx-4090", memory_gib=8), build_model("llama-3.1-8b-fp16")),
            Lengths(Fixed(1), Fixed(1)),
        )


def _small() -> tuple[SimConfig, Workload, Slos]:
    cost = CostModel(build_gpu("rtx-4090"), build_model("llama-3.1-8b-int4"))
    return (
        SimConfig(cost=cost),
        Workload(Lengths(Fixed(128), Fixed(32)), requests=300),
        Slos(ttft_p99_s=0.3, tpot_p99_s=0.05),
    )


def test_search_finds_the_edge() -> None:
    config, workload, slos = _small()
    result = max_rate(config, workload, slos, start_rate_per_s=20, rel_tol=0.02)
    assert result.feasible and result.max_rate_per_s > 1
    assert simulate(config, workload, result.max_rate_per_s, slos).meets
    assert not simulate(config, workload, result.max_rate_per_s * 1.1, slos).meets
    # Latency grows with load (same arrivals, scaled).
    lo = simulate(config, workload, result.max_rate_per_s / 4, slos)
    hi = simulate(config, workload, result.max_rate_per_s, slos)
    assert lo.ttft_p99_s <= hi.ttft_p99_s and lo.tpot_p99_s <= hi.tpot_p99_s


def test_unreachable_slo_is_reported() -> None:
    config, workload, _ = _small()
    result = max_rate(config, workload, Slos(0.001, 0.001), start_rate_per_s=20)
    assert not result.feasible and result.max_rate_per_s == 0 and len(result.probes) == 1


def test_make_plan_reasons_step_by_step() -> None:
    config, workload, slos = _small()
    lines: list[str] = []
    plan = make_plan(
        PlanInputs(
            cost=config.cost,
            lengths=workload.lengths,
            slos=slos,
            requests_per_probe=200,
            headroom=0.25,
            expected_rate_per_s=5,
        ),
        say=lines.append,
    )
    assert lines == plan.lines
    assert [line.split(".")[0] for line in lines if line[0].isdigit()] == [
        str(i) for i in range(1, 11)
    ]
    assert "131072 B" in lines[2] and f"{plan.capacity.kv_capacity_tokens:,} tokens" in lines[3]
    assert plan.recommended_rate_per_s == pytest.approx(plan.search.max_rate_per_s * 0.75)
    assert plan.at_recommended is not None and plan.at_recommended.meets


def test_cli() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairgate.cli.main",
            "plan",
            "--model",
            "llama-3.1-8b-fp16",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "16",
            "--requests",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "131072 B" in proc.stdout and "35,228 tokens" in proc.stdout
    assert "Highest rate meeting the SLOs" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "fairgate.cli.main", "plan", "--model", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "unknown model" in bad.stderr


def test_datacenter_presets_and_tensor_parallelism() -> None:
    from fairgate.plan.capacity import build_gpu, build_model, tensor_parallel

    from service.engines.simulator.hardware import GPUS, CostModel

    small = build_model("llama-3.1-8b-int4")
    by_memory = sorted(GPUS.values(), key=lambda g: g.memory_bytes)
    caps = [CostModel(g, small).kv_capacity_tokens for g in by_memory]
    assert caps == sorted(caps) and caps[0] > 0
    assert {"a100-80gb", "l40s", "h100-sxm", "h200"} <= set(GPUS)
    big = build_model("llama-3.1-70b-fp16")
    assert big.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    h100 = build_gpu("h100-sxm")
    with pytest.raises(ValueError, match="does not fit"):
        _ = CostModel(h100, big).kv_capacity_tokens
    tp2 = tensor_parallel(h100, 2)
    assert tp2.memory_bytes == 2 * h100.memory_bytes
    assert tp2.effective_bandwidth == pytest.approx(2 * 0.9 * h100.effective_bandwidth)
    assert CostModel(tp2, big, reserve_bytes=4e9).kv_capacity_tokens > 0
    # One H200 holds the 70B model in fp8; an L40S pair (PCIe) scales less than NVLink.
    assert CostModel(build_gpu("h200"), build_model("llama-3.1-70b-fp8")).kv_capacity_tokens > 0
    l40s = build_gpu("l40s")
    assert tensor_parallel(l40s, 2).effective_flops == pytest.approx(
        2 * 0.75 * l40s.effective_flops
    )
    with pytest.raises(ValueError):
        tensor_parallel(h100, 0)


def test_cli_json_with_tensor_parallelism() -> None:
    import json

    proc = subprocess.run(
        [
            *(sys.executable, "-m", "fairgate.cli.main", "plan", "--gpu", "h100-sxm", "--tp", "2"),
            *("--model", "llama-3.1-70b-fp8", "--prompt-tokens", "256", "--output-tokens", "64"),
            *("--requests", "100", "--rate", "1", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["gpu"]["name"] == "2× h100-sxm (TP2)"
    assert plan["model"]["name"] == "llama-3.1-70b-fp8"
    assert plan["kv_capacity_tokens"] > 0 and plan["feasible"] is True
    assert plan["recommended_rate_per_s"] == pytest.approx(plan["max_rate_per_s"] * 0.8)
    assert plan["at_expected"]["rate_per_s"] == 1 and plan["probes"]
    assert plan["steps"][0].startswith("1. GPU 2× h100-sxm")


def test_a_model_that_does_not_fit_gets_the_sizes_and_the_next_steps() -> None:
    from fairgate.cli.main import app
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["plan", "--gpu", "rtx-4090", "--model", "llama-3.1-70b-int4"])
    assert r.exit_code == 2
    line = " ".join(r.stderr.split())
    weights = build_model("llama-3.1-70b-int4").weight_bytes / 1e9
    assert f"does not fit in rtx-4090: weights {weights:.1f} GB + reserve 2.0 GB" in line
    assert "the 22.7 GB usable (88% of 24 GiB)" in line
    # Two 4090s hold its 38 GB; or a smaller model, or a bigger GPU.
    assert "split it over 2 GPUs (--tp 2)" in line and "a GPU with more memory" in line
    fast = ["--requests", "20", "--prompt-tokens", "64", "--output-tokens", "16"]
    r = CliRunner().invoke(
        app, ["plan", "--gpu", "rtx-4090", "--model", "llama-3.1-70b-int4", "--tp", "2", *fast]
    )
    assert r.exit_code == 0, r.stderr
