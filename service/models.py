"""Served models: each pairs an engine with its tokenizer, limits and dispatcher."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from scheduler import rules
from scheduler.gate import AdmissionGate
from service.chat_template import ChatTemplate
from service.engines.protocol import Engine
from service.tokenizer import Tokenizer


@dataclass(slots=True)
class ServedModel:
    name: str
    engine: Engine
    tokenizer: Tokenizer
    # The Dispatcher, in memory or shared (store=redis): never asked which.
    dispatcher: AdmissionGate
    max_context_tokens: int
    max_output_tokens: int
    default_max_tokens: int
    vocab_size: int
    # Renders chat messages into the prompt (the model's, or the default ChatML).
    chat_template: ChatTemplate
    # The engine's priority-preemption threshold (None: it never preempts) and
    # whether light tenants are lent room beyond it, for rules.engine_priority.
    preempt_threshold: int | None = None
    isolation: rules.Isolation = rules.Isolation.RESERVE
    # A pool routing by locality: a prompt's prefix keys, for locality-aware
    # admission and routing (None: the engine has no locality).
    prefix_keys: Callable[[Sequence[int]], Sequence[int]] | None = None


class ModelRegistry:
    def __init__(self, models: list[ServedModel], default: str) -> None:
        self._models = {m.name: m for m in models}
        if default not in self._models:
            raise ValueError(f"default model {default!r} is not among {sorted(self._models)}")
        self.default = default

    def resolve(self, name: str) -> ServedModel | None:
        return self._models.get(name or self.default)

    def names(self) -> list[str]:
        return sorted(self._models)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())
