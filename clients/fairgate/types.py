"""Plain result types of the Python client (no protobuf in user code)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    index: int
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class Timings:
    queue_wait_s: float
    time_to_first_token_s: float | None
    total_s: float


@dataclass(frozen=True, slots=True)
class Result:
    request_id: str
    model: str
    # "stop", "length", "cancelled" or "error".
    finish_reason: str
    stop_matched: str
    usage: Usage
    timings: Timings
    message: str = ""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    result: Result
    token_ids: tuple[int, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_context_tokens: int
    max_output_tokens: int
    engine: str
    exact_token_counts: bool
    vocab_size: int
    is_default: bool
