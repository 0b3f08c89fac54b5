"""One request in the discrete-event driver: what arrives, and what becomes of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.errors import SchedulingError
from scheduler.request import Priority, QueuedRequest
from service.engines.placed import Placed
from service.engines.protocol import EngineRequest
from service.engines.simulator.core import SimRequest
from service.engines.staged_prefill import Staging

if TYPE_CHECKING:
    from fairgate.bench.event_driver import Driver


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    priority: Priority = Priority.INTERACTIVE
    # Client cancel this long after arrival (queued or running); None: never.
    cancel_after_s: float | None = None
    # The caller vanishes without calling cancel (the dispatcher finds out itself).
    cancel_silently: bool = False
    deadline_after_s: float | None = None
    # The engine fails the request after this many output tokens.
    fail_after_tokens: int | None = None
    # Its prompt (shared prefixes); None: ids of its own (`distinct_prompt_ids`).
    prompt_ids: tuple[int, ...] | None = None


@dataclass(slots=True, eq=False)
class Call:
    arrival: Arrival
    req: QueuedRequest
    index: int  # arrival order: its prompt ids (shared with no other request)
    gone: bool = False
    state: str = "new"  # queued, running, done, rejected, cancelled, expired
    output_tokens: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    # When each output token arrived (the end of the engine step that made it).
    token_times_s: list[float] = field(default_factory=list)
    done_s: float | None = None
    error: SchedulingError | None = None
    driver: Driver | None = None
    prompt_ids: list[int] = field(default_factory=list)
    # Where it runs (the worker's index), and the placement's record of it there.
    worker: int = 0
    placed: Placed | None = None
    cached_tokens: int = 0
    # Of those, the ones charged at the cached rate (its own stages' are not).
    charged_cached: int = 0
    output_ids: list[int] = field(default_factory=list)
    sim_req: SimRequest | None = None
    # Staged prefill (as the engine adapters do it): its progress, the engine
    # priority its stages and itself go with, and the stage under way.
    staging: Staging | None = None
    engine_priority: int = 0
    stage_req: SimRequest | None = None
    # Its turn in its worker's lane came (its stages planned): one that stepped
    # aside for a short prompt (`StagedPrefill.short_first`) resumes them.
    lane_turned: bool = False
    # Sent to its engine (after any cold-start hold); held since, and the engine
    # request it waits with (Placement.hold_until).
    sent_s: float | None = None
    held_since_s: float | None = None
    held_req: EngineRequest | None = None

    def wanted(self) -> bool:
        return not self.gone

    def admitted(self) -> None:
        assert self.driver is not None
        self.admitted_s = self.driver.clock.now_s()
        self.driver._on_admitted(self)

    def rejected(self, error: SchedulingError) -> None:
        assert self.driver is not None
        self.driver._on_rejected(self, error)
