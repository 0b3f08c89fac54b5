"""Staged prefill's round trip on the virtual fleet: a stage's successor (the next
stage, the request whole, the lane's next request) is sent in answer to the
stage's end, so it reaches the engine after the engine has formed its next step
(a sim-server or SGLang loop forms it at once; the answer crosses the gateway).
On a busy engine every stage then costs a step of its own without it, as live
(docs/benchmarks.md, "Long mix on two workers: traced")."""

from __future__ import annotations

import pytest
from fairgate.bench.event_driver import Arrival, Driver
from fairgate.bench.stagger import FCFS, EngineMode, fleet

from service.engines.simulator.core import SimCore, StepResult
from service.engines.staged_prefill import StagedPrefill

DOC = tuple(range(1000, 4000))  # 3000 cold tokens: stages of 512


def _steps(monkeypatch: pytest.MonkeyPatch) -> list[StepResult]:
    seen: list[StepResult] = []
    step = SimCore.step

    def recording(core: SimCore) -> StepResult:
        seen.append(step(core))
        return seen[-1]

    monkeypatch.setattr(SimCore, "step", recording)
    return seen


def _staged_beside_a_decoder(mode: EngineMode) -> Driver:
    """One engine: a request decoding throughout (it never idles), and a cold
    3000-token prompt staged in 512s beside it."""
    trace = [
        Arrival(0.0, "conv", 64, 400),
        Arrival(0.05, "docs", len(DOC), 16, prompt_ids=DOC),
    ]
    plan = StagedPrefill(min_tokens=2049, stage_tokens=512, cold_only=True)
    return fleet(trace, 1, None, plan, mode=mode)


def test_on_a_busy_engine_each_stage_misses_the_step_formed_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = _steps(monkeypatch)
    drv = _staged_beside_a_decoder(FCFS)
    busy, staged = drv.calls
    assert staged.staging is not None and staged.staging.computed == 2560
    assert busy.done_s is not None and staged.first_token_s is not None
    assert staged.first_token_s < busy.done_s  # the engine decoded all along
    prefills = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert prefills == [64, 512, 512, 512, 512, 512, 3000 - 2560]
    # Between two of its prefill steps, a decode-only step: the round trip.
    first = next(i for i, s in enumerate(steps) if s.prefill_tokens == 512)
    window = steps[first : first + 2 * len(prefills[1:]) - 1]
    assert [bool(s.prefill_tokens) for s in window] == [True, False] * (len(prefills) - 2) + [True]


def test_an_idle_engine_takes_the_next_stage_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _steps(monkeypatch)
    plan = StagedPrefill(min_tokens=2049, stage_tokens=512, cold_only=True)
    fleet([Arrival(0.0, "docs", len(DOC), 16, prompt_ids=DOC)], 1, None, plan)
    prefills = [s.prefill_tokens for s in steps]
    # Back to back: nothing else to step while the answer crosses the gateway.
    assert prefills[:6] == [512, 512, 512, 512, 512, 3000 - 2560]


def test_without_the_round_trip_the_stages_go_back_to_back_on_a_busy_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The what-if (`EngineMode.round_trip` False, `bench stagger --no-round-trip`):
    each stage's successor is in the engine when its next step forms, so a busy
    engine carries the prompt's prefill in consecutive steps, no decode step between."""
    steps = _steps(monkeypatch)
    drv = _staged_beside_a_decoder(EngineMode(round_trip=False))
    busy, staged = drv.calls
    assert staged.staging is not None and staged.staging.computed == 2560
    assert busy.done_s is not None and staged.first_token_s is not None
    prefills = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert prefills == [64, 512, 512, 512, 512, 512, 3000 - 2560]
    first = next(i for i, s in enumerate(steps) if s.prefill_tokens == 512)
    assert [s.prefill_tokens for s in steps[first : first + 6]] == prefills[1:]
