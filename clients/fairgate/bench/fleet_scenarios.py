"""What `fairgate bench fleet` sends: a prefix-heavy mix of token-id prompts.

Pure and seeded: the plan (arrival times, prompts as token ids, max_tokens)
is drawn once per benchmark and every variant replays it; each tenant draws
from its own generator. Prompts are token ids (fairgate's `token_ids`, SGLang's
`input_ids`), so every gateway hands the workers the very same ids and the
workers' radix caches see the same prefixes.

Tenants (weights 1:1:2 among the backlogged ones, plus a light one):
  sys    one long system prompt of its own + a short user text, short output
  chat   multi-turn conversations: turn k+1 re-sends turn k's prompt, the
         reply the engine actually gave (its output ids: same length in every
         variant, ignore_eos) and a new user text; the first turn leaves at its
         planned time, each later one a think time after the previous reply ended
  rag    one of a few shared documents + a question, short output
  light  short distinct prompts at a low Poisson rate: the victim whose TTFT
         is set beside its solo run through the same stack
Arrivals are Poisson; the offered load is sized (`load` = 1) to keep the three
heavy tenants backlogged on N workers even when every prefix hits.

`--mix long`: `bench stagger`'s long-prompt mix instead (fleet_long.py: cold
1-6 k-token prompts of two tenants, 200-1500 of a third, the light tenant at
2 requests/s), the same tenants and rates as the virtual fleet's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fairgate.bench.workload import FIRST_PLAIN_ID

VOCAB_SIZE = 32000
# Every worker (simulated RTX 4090, Llama-3.1-8B int4), kept small so that a
# 2-core host keeps up and that the fleet's prefixes outgrow one worker's cache.
MAX_RUNNING_REQUESTS = 16
KV_CAPACITY_TOKENS = 16000
KV_TARGET_FRACTION = 0.9

SYS_PROMPT_TOKENS = 1500
RAG_DOCS = 5
RAG_DOC_TOKENS = (2000, 4000)
MAX_PROMPT_TOKENS = 6000  # a conversation ends before its prompt would pass this

# Offered requests (or conversations) per simulated second per worker at load 1.
RATES_PER_WORKER = {"sys": 10.0, "rag": 16.0, "chat": 2.0, "light": 0.25}
WEIGHTS = {"sys": 1.0, "chat": 1.0, "rag": 2.0, "light": 1.0}
VICTIM = "light"
MIXES = ("prefix", "long")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_PLAIN_ID, VOCAB_SIZE) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class Turn:
    user_ids: tuple[int, ...]  # the new user text this turn adds
    max_tokens: int
    think_s: float  # after the previous reply, before this turn leaves


@dataclass(frozen=True, slots=True)
class Item:
    """One planned request, or (turns) one conversation whose first turn leaves at `t_s`."""

    t_s: float
    tenant: str
    prompt_ids: tuple[int, ...] = ()
    max_tokens: int = 0
    turns: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class FleetScenario:
    """The plan for `workers` workers over `seconds` simulated seconds."""

    workers: int
    seconds: float
    load: float = 1.0
    victim: str = VICTIM
    mix: str = "prefix"  # fleet_long.LongScenario: "long"

    @property
    def weights(self) -> dict[str, float]:
        return dict(WEIGHTS)

    @property
    def heavy(self) -> list[str]:
        return [t for t in self.weights if t != self.victim]

    def rate(self, tenant: str) -> float:
        scale = 1.0 if tenant == self.victim else self.load
        return RATES_PER_WORKER[tenant] * self.workers * scale

    def _arrivals(self, rng: random.Random, tenant: str) -> list[float]:
        out, rate = [], self.rate(tenant)
        t = rng.expovariate(rate)
        while t < self.seconds:
            out.append(t)
            t += rng.expovariate(rate)
        return out

    def plan(self, seed: int) -> list[Item]:
        items: list[Item] = []
        rng = random.Random(f"{seed}:sys")
        system = _ids(rng, SYS_PROMPT_TOKENS)
        for t in self._arrivals(rng, "sys"):
            prompt = system + _ids(rng, rng.randint(20, 120))
            items.append(Item(t, "sys", tuple(prompt), rng.randint(16, 64)))
        rng = random.Random(f"{seed}:rag")
        docs = [_ids(rng, rng.randint(*RAG_DOC_TOKENS)) for _ in range(RAG_DOCS)]
        for t in self._arrivals(rng, "rag"):
            prompt = rng.choice(docs) + _ids(rng, rng.randint(16, 64))
            items.append(Item(t, "rag", tuple(prompt), rng.randint(16, 64)))
        rng = random.Random(f"{seed}:chat")
        for t in self._arrivals(rng, "chat"):
            turns = tuple(
                Turn(
                    tuple(
                        _ids(
                            rng,
                            rng.randint(40, 200) if k == 0 else rng.randint(20, 120),
                        )
                    ),
                    rng.randint(64, 192),
                    0.0 if k == 0 else rng.expovariate(1.0),
                )
                for k in range(rng.randint(3, 8))
            )
            items.append(Item(t, "chat", turns=turns))
        rng = random.Random(f"{seed}:light")
        for t in self._arrivals(rng, "light"):
            items.append(Item(t, "light", tuple(_ids(rng, rng.randint(32, 128))), 16))
        return sorted(items, key=lambda i: (i.t_s, i.tenant))

    def longest_prompt_tokens(self, plan: list[Item]) -> int:
        """The longest prompt the plan can send (a conversation's last turn at most
        MAX_PROMPT_TOKENS)."""
        one_shot = max((len(i.prompt_ids) for i in plan), default=1)
        return max(one_shot, MAX_PROMPT_TOKENS if any(i.turns for i in plan) else 0)
