"""The priority an engine that schedules by priority (SGLang) is sent: light
tenants first, interactive before batch, heavy prompts by recompute cost, and
the lent request's priority that makes the engine preempt."""

from __future__ import annotations

import bisect

# Prompt lengths (tokens) that split heavy requests into tiers of recompute
# cost, for an engine that preempts (`engine_priority`).
COST_TIERS_TOKENS = (128, 512, 2048)
# A light tenant's request is treated as light by the engine (prefilled first;
# lent room, it retracts a running request) only while the prompt it brings is
# short: up to this many uncached tokens. Admission calls every tenant with a
# short queue light, so on a fleet with room the heavy tenants' long prompts were
# light too, and lent, then sent with the lent priority; the light tenant's chat
# request, of the same rank, waited out their prefill steps (issue #33: 236-643
# ms on the simulated fleet).
LIGHT_PREFILL_TOKENS = COST_TIERS_TOKENS[1]


def light_request(light_tenant: bool, uncached_prompt_tokens: int) -> bool:
    """Does the engine treat this request as light (`engine_priority`,
    `lent_slot_priority`, the placement's soonest worker)?"""
    return light_tenant and uncached_prompt_tokens <= LIGHT_PREFILL_TOKENS


def engine_priority(
    batch: bool,
    light_tenant: bool,
    threshold: int | None = None,
    lent: bool = False,
    prompt_tokens: int | None = None,
) -> int:
    """The priority sent to an engine that schedules by priority (SGLang: larger
    first). A light tenant's request is prefilled before the heavy tenants' queued
    prompts (admitted at once, it would otherwise wait in the engine behind them);
    interactive before batch within each.

    `threshold`: the engine retracts a running request for a newcomer whose
    priority exceeds it by more than this (SGLang's
    --priority-scheduling-preemption-threshold; None: it never preempts). Those
    priorities stay within it, so nothing running is retracted — except for a
    request admitted `lent` room beyond the engine's (Isolation.PREEMPT): its
    priority clears every other by more than the threshold.

    `prompt_tokens` (given under Isolation.PREEMPT): heavy requests also rise
    with their prompt's tier (`COST_TIERS_TOKENS`), because the engine retracts
    the lowest priority first (then the latest arrival) and a retracted request's
    prompt is prefilled again: a short prompt is the cheapest to give up
    (bench (f) in the simulator: ~0.96x FCFS throughput without the tiers, ~1.0x
    with them)."""
    step = 0 if batch else 1
    if prompt_tokens is None:
        p, top = step + (2 if light_tenant else 0), 3
    else:
        tiers = len(COST_TIERS_TOKENS) + 1
        top = 2 * tiers + 1
        if light_tenant:
            p = 2 * tiers + step
        else:
            p = tiers * step + bisect.bisect_right(COST_TIERS_TOKENS, prompt_tokens)
    if threshold is None:
        return p
    if not lent:
        return min(p, threshold)
    if threshold < 1:
        return 1  # over every other (all 0); a gap of 1 would preempt among lent ones
    return threshold + 1 + min(top, threshold) + step  # lent batch - the top = threshold + 1


def lent_slot_priority(
    batch: bool, light_tenant: bool, threshold: int | None, prompt_tokens: int | None
) -> int | None:
    """A light request's priority where a pool routes it to a worker with no free
    slot (`Placement.priority_on`): a lent request's, which the engine retracts a
    running request for. None where there is no such slot to take: not a light
    tenant's, or an engine that does not preempt (`threshold` None; the caller
    passes None outside Isolation.PREEMPT too)."""
    if not light_tenant or threshold is None:
        return None
    return engine_priority(batch, True, threshold, True, prompt_tokens)
