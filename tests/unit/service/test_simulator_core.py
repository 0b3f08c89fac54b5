"""The simulator's cost model and continuous-batching core, clock-free."""

from __future__ import annotations

import pytest

from service.engines.protocol import FinishKind, SamplingOptions
from service.engines.simulator.core import QueueFull, SimConfig, SimCore
from service.engines.simulator.hardware import GIB, preset


def test_cost_model_matches_documented_4090_figures() -> None:
    fp16 = preset(model="llama-3.1-8b-fp16")
    int4 = preset(model="llama-3.1-8b-int4")
    assert fp16.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert fp16.gpu.memory_bytes == 24 * GIB
    # ~4-5 GB left for KV in fp16 (~35k tokens); ~110k tokens with 4-bit weights.
    assert 30_000 < fp16.kv_capacity_tokens < 40_000
    assert 100_000 < int4.kv_capacity_tokens < 125_000
    # Single-stream decode: ~20 ms/token fp16, ~7-8 ms (+launch overhead) in 4-bit.
    assert 0.018 < fp16.step_s(0, 1, 500) < 0.023
    assert 0.006 < int4.step_s(0, 1, 500) < 0.0095
    # Decode is memory-bound: a batch of 32 costs far less than 32 single steps.
    assert int4.step_s(0, 32, 32 * 500) < 3 * int4.step_s(0, 1, 500)
    # Prefill is compute-bound and linear in tokens.
    assert int4.prefill_s(2000) > 1.8 * int4.prefill_s(1000) - int4.prefill_overhead_s


def _core(**kw: object) -> SimCore:
    return SimCore(SimConfig(cost=preset(), **kw))  # type: ignore[arg-type]


def _run_to_idle(core: SimCore, max_steps: int = 100_000) -> dict[str, FinishKind]:
    done: dict[str, FinishKind] = {}
    for _ in range(max_steps):
        if core.idle:
            return done
        for em in core.step().emissions:
            if em.finish is not None:
                done[em.rid] = em.finish
    raise AssertionError("simulator did not drain")


def test_requests_finish_by_length_and_kv_returns_to_zero() -> None:
    core = _core()
    for i in range(20):
        core.add(core.make_request(f"r{i}", [17] * 100, 50 + i, SamplingOptions()))
    done = _run_to_idle(core)
    assert done == {f"r{i}": FinishKind.LENGTH for i in range(20)}
    assert core.used_kv == 0


def test_chunked_prefill_splits_long_prompts() -> None:
    core = _core(chunked_prefill_size=512)
    core.add(core.make_request("long", [17] * 2000, 4, SamplingOptions()))
    steps = [core.step() for _ in range(4)]
    assert [s.prefill_tokens for s in steps] == [512, 512, 512, 464]
    assert not steps[2].emissions and len(steps[3].emissions) == 1  # first token after prefill


def test_max_running_requests_queues_the_rest_fcfs() -> None:
    core = _core(max_running_requests=2)
    for i in range(4):
        core.add(core.make_request(f"r{i}", [17] * 10, 5, SamplingOptions()))
    core.step()
    assert [r.rid for r in core.running] == ["r0", "r1"]
    assert [r.rid for r in core.waiting] == ["r2", "r3"]


def test_kv_pressure_preempts_and_still_completes() -> None:
    core = _core(kv_capacity_tokens=3000, new_token_ratio=0.0)
    for i in range(8):
        core.add(core.make_request(f"r{i}", [17] * 200, 400, SamplingOptions()))
    done = _run_to_idle(core)
    assert len(done) == 8
    assert core.preemptions > 0
    assert core.used_kv == 0


def test_abort_frees_kv_waiting_and_running() -> None:
    core = _core(max_running_requests=1)
    core.add(core.make_request("a", [17] * 50, 100, SamplingOptions()))
    core.add(core.make_request("b", [17] * 50, 100, SamplingOptions()))
    core.step()
    assert core.used_kv > 0
    assert core.abort("a") and core.abort("b")
    assert not core.abort("a")
    assert core.idle and core.used_kv == 0


def test_queue_limit_and_duplicate_ids() -> None:
    core = _core(max_queued_requests=1)
    core.add(core.make_request("a", [17], 1, SamplingOptions()))
    with pytest.raises(QueueFull):
        core.add(core.make_request("b", [17], 1, SamplingOptions()))
    core2 = _core()
    core2.add(core2.make_request("a", [17], 1, SamplingOptions()))
    with pytest.raises(ValueError, match="duplicate"):
        core2.add(core2.make_request("a", [17], 1, SamplingOptions()))


def test_eos_ends_requests_early_unless_ignored() -> None:
    core = _core(mean_output_tokens=5.0)
    for i in range(10):
        core.add(core.make_request(f"r{i}", [17], 200, SamplingOptions(seed=i)))
    core.add(core.make_request("keep", [17], 200, SamplingOptions(ignore_eos=True)))
    done = _run_to_idle(core)
    assert sum(1 for k, v in done.items() if k != "keep" and v is FinishKind.STOP) >= 8
    assert done["keep"] is FinishKind.LENGTH


def _text(prompt: list[int], sampling: SamplingOptions, core: SimCore | None = None) -> str:
    core = core or _core()
    core.add(core.make_request("r", prompt, 24, sampling))
    words: list[str] = []
    while not core.idle:
        words += [em.text for em in core.step().emissions]
    return "".join(words)


def test_text_follows_the_seed_and_the_temperature() -> None:
    prompt = [17, 18, 19]
    seeded = _text(prompt, SamplingOptions(seed=7))
    assert seeded.strip() and seeded == _text(prompt, SamplingOptions(seed=7))
    assert seeded != _text(prompt, SamplingOptions(seed=8))
    # Another temperature samples other text from the same seed, as a model does.
    assert seeded != _text(prompt, SamplingOptions(seed=7, temperature=0.5))
    # Greedy: the prompt decides, whatever the seed; unseeded: each request its own.
    greedy = _text(prompt, SamplingOptions(temperature=0.0))
    assert greedy == _text(prompt, SamplingOptions(temperature=0.0, seed=3))
    assert greedy != _text([17, 18, 20], SamplingOptions(temperature=0.0))
    core = _core()
    assert len({_text(prompt, SamplingOptions(), core) for _ in range(3)}) == 3


def _first_token_order(core: SimCore, steps: int = 50) -> list[str]:
    order: list[str] = []
    for _ in range(steps):
        for em in core.step().emissions:
            if em.generated == 1:
                order.append(em.rid)
    return order


@pytest.mark.parametrize("enabled", [True, False])
def test_priority_scheduling_prefills_urgent_requests_first(enabled: bool) -> None:
    # As SGLang with --enable-priority-scheduling: the waiting prefills go by
    # priority (larger first), but a chunked prefill under way finishes first.
    core = _core(chunked_prefill_size=512, priority_scheduling=enabled)
    core.add(core.make_request("long", [17] * 1200, 2, SamplingOptions(), priority=0))
    core.step()  # 512 of its 1200 prompt tokens: under way
    for i in range(3):
        core.add(core.make_request(f"low{i}", [17] * 400, 2, SamplingOptions(), priority=0))
    core.add(core.make_request("urgent", [17] * 100, 2, SamplingOptions(), priority=3))
    order = _first_token_order(core)
    if enabled:
        assert order == ["long", "urgent", "low0", "low1", "low2"]
    else:  # priorities ignored: FCFS
        assert order == ["long", "low0", "low1", "low2", "urgent"]


def test_priority_scheduling_orders_the_waiting_queue() -> None:
    core = _core(max_running_requests=1, priority_scheduling=True)
    for rid, prio in [("a", 0), ("b", 1), ("c", 0), ("d", 1)]:
        core.add(core.make_request(rid, [17] * 10, 1, SamplingOptions(), priority=prio))
    assert [r.rid for r in core.waiting] == ["b", "d", "a", "c"]  # FCFS among equals
