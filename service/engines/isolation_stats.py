"""What issue #33's isolation levers did on an engine or a pool since it started:
counters for the `fairgate.engine.isolation_events` metric, so that an operator
can see the levers act (and a diagnosis can see why a light request found no
worker free of long prefill)."""

from __future__ import annotations

from service.engines.pool import WorkerPool
from service.engines.staged_prefill import StagingStats

# The counters, in the order they are reported (the metric's `fairgate.isolation.event`).
EVENTS = (
    "kept_free",  # a long prompt kept off the last worker on short steps (or the light's pick)
    "kept_given_up",  # ... let onto it: no other worker's KV held it
    "held",  # a cold long prompt held while every worker was mid-prefill
    "held_to_bound",  # ... released by the hold's bound, not by a worker's prefill ending
    "paced",  # a short prompt held: every worker's short prefill queued at the pace
    "paced_to_bound",  # ... released by the hold's bound
    "staged_requests",  # prompts sent as prefix stages
    "stages",  # prefill-only stages sent
    "stages_wide",  # ... of them widened: the worker was sheltered
    "stages_evicted",  # stagings ended early: a stage found its predecessors evicted
    "stages_refused",  # ... or the engine refused a stage
    "lane_yielded",  # a staged prompt let a short one take the lane between its stages
)


def isolation_counts(engine: object) -> dict[str, int]:
    """The counters of `engine` (a worker pool, or one engine that stages
    prompts); an engine with neither lever reports zeros."""
    counts = dict.fromkeys(EVENTS, 0)
    stagings: list[StagingStats] = []
    if isinstance(engine, WorkerPool):
        st = engine.placement.stagger
        counts["kept_free"], counts["kept_given_up"] = st.kept_free, st.kept_given_up
        counts["held"], counts["held_to_bound"] = st.held, st.held_to_bound
        counts["paced"], counts["paced_to_bound"] = st.paced, st.paced_to_bound
        stagings = [w.engine.staging for w in engine.workers]
    elif isinstance(staging := getattr(engine, "staging", None), StagingStats):
        stagings = [staging]
    for s in stagings:
        counts["staged_requests"] += s.staged_requests
        counts["stages"] += s.stages
        counts["stages_wide"] += s.wide_stages
        counts["stages_evicted"] += s.evicted
        counts["stages_refused"] += s.refused
        counts["lane_yielded"] += s.yielded
    return counts


def unsent_requests(engine: object) -> int | None:
    """Requests admitted that no worker has yet (a pool's held, paced and laned
    prompts: `WorkerPool.unsent`); None for an engine that holds none back."""
    return engine.unsent() if isinstance(engine, WorkerPool) else None
