"""What `fairgate bench fairness` sends: request shapes, tenants and scenarios.

Pure and seeded: a scenario's trace (arrival time, tenant, prompt length,
max_tokens) is drawn once per run of the benchmark and every policy replays
exactly that trace; each tenant draws from its own generator, so adding a
tenant does not change the others' requests.

Shapes (outputs always run to max_tokens: the benchmark sends ignore_eos):
  fixed        256 / 256
  long_prompt  prompt 1500-2000, output 8-32 (RAG, summarisation)
  long_output  prompt ~32, output 400-512 (generation)
  chat         lognormal prompt and output, means ~300 / ~150, capped
  rag          shaped like a production trace's long-prompt service (BurstGPT-like):
               lognormal prompt, median ~1.5 k, up to 6 k; output median ~13
  conversation multi-turn chat: each turn re-sends the history (prompt grows
               turn by turn, 1-8 turns), output lognormal mean ~150

Arrivals are Poisson, or gamma with a coefficient of variation above 1
(`TenantLoad.burst_cv`): the bursts of real traffic (BurstGPT's inter-arrival
times fit a gamma of CV ~2-3).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# The engine every scenario runs against (simulated RTX 4090, Llama-3.1-8B int4),
# kept small so that overload is cheap to produce on a 2-core host.
MAX_RUNNING_REQUESTS = 32
KV_CAPACITY_TOKENS = 20000
KV_TARGET_FRACTION = 0.9
M_TOKENS = int(KV_CAPACITY_TOKENS * KV_TARGET_FRACTION)  # KV tokens fairgate admits at most


@dataclass(frozen=True, slots=True)
class Shape:
    """A request-length distribution; `capacity_rps` is what the engine above serves
    of this shape alone (fairgate's gate in front, measured offline with the simulator
    core), used to size each tenant's offered load."""

    name: str
    capacity_rps: float

    def sample(self, rng: random.Random) -> tuple[int, int]:
        """(prompt tokens, max_tokens)."""
        if self.name == "long_prompt":
            return rng.randint(1500, 2000), rng.randint(8, 32)
        if self.name == "long_output":
            return rng.randint(24, 40), rng.randint(400, 512)
        if self.name == "chat":
            # sigma 1 lognormals; mu set so the untruncated means are 300 and 150.
            prompt = rng.lognormvariate(math.log(300) - 0.5, 1.0)
            output = rng.lognormvariate(math.log(150) - 0.5, 1.0)
            return min(2000, max(8, round(prompt))), min(512, max(4, round(output)))
        if self.name == "rag":
            prompt = rng.lognormvariate(math.log(1500), 0.6)
            output = rng.lognormvariate(math.log(13), 0.8)
            return min(6000, max(200, round(prompt))), min(128, max(1, round(output)))
        if self.name == "conversation":
            # Turn k of a conversation re-sends k earlier exchanges (~350 tokens each).
            turn = rng.randint(1, 8)
            history = sum(round(rng.lognormvariate(math.log(300), 0.5)) for _ in range(turn))
            output = rng.lognormvariate(math.log(150) - 0.5, 1.0)
            return min(6000, max(16, history)), min(512, max(4, round(output)))
        return 256, 256


SHAPES = {
    s.name: s
    for s in (
        Shape("fixed", 8.0),
        Shape("long_prompt", 3.0),
        Shape("long_output", 7.0),
        Shape("chat", 11.0),
        Shape("rag", 3.2),
        Shape("conversation", 2.4),
    )
}


@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float
    tenant: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class TenantLoad:
    weight: float
    shape: Shape
    # (start_s, end_s, requests/s) phases of a Poisson process
    phases: tuple[tuple[float, float, float], ...]
    # Inter-arrival coefficient of variation: 1 is Poisson; above 1, gamma
    # inter-arrivals of the same mean rate (bursts and lulls).
    burst_cv: float = 1.0

    def gap_s(self, rng: random.Random, rate: float) -> float:
        if self.burst_cv == 1.0:
            return rng.expovariate(rate)
        k = 1.0 / self.burst_cv**2  # gamma shape; its scale keeps the mean 1 / rate
        return rng.gammavariate(k, 1.0 / (k * rate))


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    tenants: dict[str, TenantLoad]
    victim: str = ""
    # With replicas: each tenant's requests go to one replica (its index in
    # `tenants`, mod N), as when each service calls a replica of its own or a
    # load balancer keeps affinity; else request i goes to replica i mod N.
    affinity: bool = False

    @property
    def replica_of(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tenants)}

    @property
    def weights(self) -> dict[str, float]:
        return {t: load.weight for t, load in self.tenants.items()}

    def trace(self, seed: int) -> list[Arrival]:
        out: list[Arrival] = []
        for tenant, load in self.tenants.items():
            rng = random.Random(f"{seed}:{tenant}")
            for start, end, rate in load.phases:
                t = start + load.gap_s(rng, rate)
                while t < end:
                    prompt, output = load.shape.sample(rng)
                    out.append(Arrival(t, tenant, prompt, output))
                    t += load.gap_s(rng, rate)
        return sorted(out, key=lambda a: (a.t_s, a.tenant))


def _steady(shape: str, weight: float, rate_per_s: float, seconds: float) -> TenantLoad:
    return TenantLoad(weight, SHAPES[shape], ((0.0, seconds, rate_per_s),))


def scenarios(seconds: float) -> dict[str, Scenario]:
    s = seconds
    fixed = SHAPES["fixed"].capacity_rps
    chat = SHAPES["chat"].capacity_rps
    victim_rps = chat / 10
    on_off = tuple((start, min(start + s / 6, s), 1.5 * fixed) for start in (0.0, s / 3, 2 * s / 3))
    return {
        "a": Scenario(
            "a",
            "two tenants overloading at rates 1:2",
            {"t1": _steady("fixed", 1, 0.75 * fixed, s), "t2": _steady("fixed", 1, 1.5 * fixed, s)},
        ),
        "b": Scenario(
            "b",
            "victim at 1/8 capacity beside a 10x flood",
            {
                "victim": _steady("fixed", 1, fixed / 8, s),
                "flood": _steady("fixed", 1, 10 * fixed, s),
            },
            victim="victim",
        ),
        "c": Scenario(
            "c",
            "weights 1:2:4, all backlogged",
            {f"w{w}": _steady("fixed", w, fixed, s) for w in (1, 2, 4)},
        ),
        "d": Scenario(
            "d",
            "idle tenant returning: on/off beside a steady one (idle time earns no credit)",
            {
                "steady": _steady("fixed", 1, 1.5 * fixed, s),
                "onoff": TenantLoad(1, SHAPES["fixed"], on_off),
            },
        ),
        # Every tenant alone would fill the engine (its share is 1/8 to 1/2 of it).
        "e": Scenario(
            "e",
            "mixed shapes, weights 1:1:2:4, all overloaded",
            {
                "lp1": _steady("long_prompt", 1, SHAPES["long_prompt"].capacity_rps, s),
                "lo1": _steady("long_output", 1, SHAPES["long_output"].capacity_rps, s),
                "chat2": _steady("chat", 2, chat, s),
                "chat4": _steady("chat", 4, chat, s),
            },
        ),
        # Shaped like real traffic (the fleet issue's measurements): a production
        # trace's long-prompt / short-output service with bursty arrivals beside a
        # multi-turn conversation service of weight 2, both overloaded, and a light
        # chat tenant, each service calling its own replica (on 2 replicas: rag and
        # light on one, conv on the other): what lost fairness in the shared path.
        "g": Scenario(
            "g",
            "real-traffic shape: bursty RAG service 1, conversations 2, a light chat tenant",
            {
                "rag": TenantLoad(
                    1, SHAPES["rag"], ((0.0, s, SHAPES["rag"].capacity_rps),), burst_cv=2.5
                ),
                "conv": _steady("conversation", 2, SHAPES["conversation"].capacity_rps, s),
                "light": _steady("chat", 1, victim_rps, s),
            },
            victim="light",
            affinity=True,
        ),
        # One engine, a long-prompt service (prompts up to 6 k tokens, several
        # prefill chunks each) beside a light chat tenant: what SGLang's
        # unpreemptible chunked prefill costs the light tenant's first token
        # (the lever: staged prefill, `--staged-prefill`).
        "h": Scenario(
            "h",
            "long prompts up to 6k beside a light chat tenant, one engine",
            {
                "long": _steady("rag", 1, SHAPES["rag"].capacity_rps, s),
                "light": _steady("chat", 1, victim_rps, s),
            },
            victim="light",
        ),
        # The same below overload: what the long prompts' own latency pays for it.
        "i": Scenario(
            "i",
            "long prompts up to 6k at 60% load beside a light chat tenant, one engine",
            {
                "long": _steady("rag", 1, 0.6 * SHAPES["rag"].capacity_rps, s),
                "light": _steady("chat", 1, victim_rps, s),
            },
            victim="light",
        ),
        "f": Scenario(
            "f",
            "light chat victim (1/10 capacity) beside two flooders at 20x its rate",
            {
                "victim": _steady("chat", 1, victim_rps, s),
                "flood1": _steady("chat", 1, 20 * victim_rps, s),
                "flood2": _steady("fixed", 1, 20 * victim_rps, s),
            },
            victim="victim",
        ),
    }
