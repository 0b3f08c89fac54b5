"""The engine Protocol and the data that crosses it.

Every engine (simulator, SGLang over HTTP, SGLang in-process) streams
`EngineChunk`s for an `EngineRequest`, can abort a request by id, and reports
its capacity and live load so the admission gate can size itself.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    # The prompt as token ids (always set) and as text when the client sent text.
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    prompt_text: str | None = None
    # Larger is more urgent (SGLang's default convention).
    priority: int = 0
    # W3C trace context to pass on (traceparent, tracestate).
    trace_headers: dict[str, str] = field(default_factory=dict)
    # The prompt's prefix keys, when a pool routing by locality computed them
    # for admission already (prefix_index.chain).
    prefix_keys: Sequence[int] = ()
    # Its tenant was light at admission: a pool routes it where it starts soonest.
    light: bool = False
    # A light request's priority when it is routed to a worker with no free slot:
    # one the engine preempts for (`rules.engine_priority`, lent); None: the
    # engine does not preempt, and the request waits for a slot.
    preempt_priority: int | None = None
    # The worker admission counted a cached prefix on (`QueuedRequest.cached_on`):
    # a pool routes there while it has room (`placement.Placement.place`).
    cached_on: int | None = None
    # Prompt tokens the pool's placement counts as cached on the worker it sent the
    # request to (`Placed.matched`); None: no pool placed it (staged_prefill.py).
    held_tokens: int | None = None
    # What that worker holds of it now (`Placement.recheck`), asked when a staged
    # request's turn in the worker's lane comes; None: `held_tokens` stands.
    held_now: Callable[[], int] | None = field(default=None, compare=False, repr=False)
    # Is a light request kept off that worker now (`Placement.sheltered`): a staged
    # request's next stage may then be wide (staged_prefill.py); None: never.
    sheltered: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    # May it take that worker's staged-prefill lane between a long prompt's stages
    # (`Placement.overtakes`, asked as the lane turns); None: never.
    overtakes: Callable[[], bool] | None = field(default=None, compare=False, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class FinishKind(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True)
class EngineChunk:
    """New output since the previous chunk; counters are running totals."""

    text: str
    token_ids: list[int]
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int = 0
    finish: FinishKind | None = None
    stop_matched: str = ""
    message: str = ""
    # Times the engine retracted the request so far (SGLang's num_retractions).
    retractions: int = 0
    # Of cached_tokens, those the request's own prefill stages put there
    # (staged_prefill.py): its work, charged as uncached prompt tokens.
    staged_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    max_running_requests: int
    # KV-cache capacity in tokens (SGLang's max_total_num_tokens).
    max_total_tokens: int
    max_context_tokens: int
    vocab_size: int
    # The engine retracts a running request for a newcomer whose priority exceeds
    # it by more than this (SGLang: --enable-priority-scheduling, preemption on,
    # --priority-scheduling-preemption-threshold); None: it never does.
    preempt_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running_requests: int
    waiting_requests: int
    used_kv_tokens: int


class EngineError(Exception):
    """The engine failed a request. `retryable` if no token reached the client."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class Engine(Protocol):
    kind: str

    async def start(self) -> None: ...

    def generate(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        """Stream chunks; the last one has `finish` set. Raises EngineError."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its resources; unknown ids are ignored."""
        ...

    def capacity(self) -> EngineCapacity: ...

    async def load(self) -> EngineLoad: ...

    async def aclose(self) -> None: ...
