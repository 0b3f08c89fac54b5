"""The engine request for an admitted request: what generation.py sends and the
virtual fleet simulates, with the priorities the engine gets (one place)."""

from __future__ import annotations

from scheduler import rules
from scheduler.request import Priority, QueuedRequest
from service.engines.protocol import EngineRequest, SamplingOptions


def engine_request(
    queued: QueuedRequest,
    request_id: str,
    prompt_ids: list[int],
    sampling: SamplingOptions,
    threshold: int | None,
    preempts: bool,
    prompt_text: str | None = None,
    takes_slot: bool = False,
) -> EngineRequest:
    """What goes to the engine for an admitted request: its priority there
    (`threshold`: the engine's preemption threshold, None: it does not preempt;
    `preempts`: Isolation.PREEMPT), the one a pool lends a full worker's slot
    with, and admission's locality choice. Light (and lent) for the engine only
    while its uncached prompt is short (`rules.light_request`). `takes_slot`: a
    light request may take a full worker's slot (the lent priority) without
    `preempts` too (Isolation.RESERVE_SLOTS: a slot lent, no KV)."""
    batch = queued.priority is Priority.BATCH
    tiers_of = queued.prompt_tokens if preempts else None
    light = rules.light_request(queued.light, queued.prompt_tokens - queued.cached_estimate)
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        prompt_text=prompt_text,
        max_tokens=queued.max_tokens,
        sampling=sampling,
        priority=rules.engine_priority(batch, light, threshold, queued.lent and light, tiers_of),
        prefix_keys=queued.prefix_keys,
        light=light,
        preempt_priority=rules.lent_slot_priority(
            batch, light, threshold if preempts or takes_slot else None, tiers_of
        ),
        cached_on=queued.cached_on if queued.cached_estimate > 0 else None,
    )
