"""What a load test sends: length distributions, arrival processes, tenant mixes.

Pure and seeded (no I/O beyond reading a trace file), so the planner can reuse
the same traffic description as the load generator.

Length specs: `256` (fixed), `128-512` (uniform, inclusive). A JSONL trace has
one request per line with `prompt_tokens` and `output_tokens`; it is replayed in
order, cycling.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class LengthDist(Protocol):
    def sample(self, rng: random.Random) -> int: ...

    @property
    def mean(self) -> float: ...

    @property
    def max(self) -> int: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Fixed:
    tokens: int

    def sample(self, rng: random.Random) -> int:
        return self.tokens

    @property
    def mean(self) -> float:
        return float(self.tokens)

    @property
    def max(self) -> int:
        return self.tokens

    def describe(self) -> str:
        return f"{self.tokens}"


@dataclass(frozen=True, slots=True)
class Uniform:
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def max(self) -> int:
        return self.high

    def describe(self) -> str:
        return f"uniform {self.low}-{self.high}"


def parse_length(spec: str) -> LengthDist:
    """`N` → Fixed(N); `LO-HI` → Uniform(LO, HI); lengths are >= 1."""
    text = spec.strip()
    try:
        if "-" in text:
            lo_s, hi_s = text.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if not 1 <= lo <= hi:
                raise ValueError
            return Uniform(lo, hi)
        n = int(text)
    except ValueError:
        raise ValueError(f"bad length {spec!r}: use N or LO-HI with 1 <= LO <= HI") from None
    if n < 1:
        raise ValueError(f"bad length {spec!r}: must be >= 1")
    return Fixed(n)


@dataclass(frozen=True, slots=True)
class Trace:
    """(prompt_tokens, output_tokens) pairs replayed in order, cycling."""

    pairs: tuple[tuple[int, int], ...]

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        pairs: list[tuple[int, int]] = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    p, o = int(row["prompt_tokens"]), int(row["output_tokens"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{lineno}: {exc}") from None
                if p < 1 or o < 1:
                    raise ValueError(f"{path}:{lineno}: token counts must be >= 1")
                pairs.append((p, o))
        if not pairs:
            raise ValueError(f"{path}: no requests in the trace")
        return cls(tuple(pairs))


@dataclass(frozen=True, slots=True)
class Lengths:
    """Where each request's (prompt, output) lengths come from."""

    prompt: LengthDist
    output: LengthDist
    trace: Trace | None = None

    def sampler(self, seed: int) -> LengthSampler:
        return LengthSampler(self, random.Random(seed))

    @property
    def mean_prompt(self) -> float:
        if self.trace:
            return sum(p for p, _ in self.trace.pairs) / len(self.trace.pairs)
        return self.prompt.mean

    @property
    def mean_output(self) -> float:
        if self.trace:
            return sum(o for _, o in self.trace.pairs) / len(self.trace.pairs)
        return self.output.mean

    def describe(self) -> str:
        if self.trace:
            return f"trace of {len(self.trace.pairs)} requests"
        return f"prompt {self.prompt.describe()}, output {self.output.describe()} tokens"


class LengthSampler:
    def __init__(self, lengths: Lengths, rng: random.Random) -> None:
        self._lengths = lengths
        self._rng = rng
        self._next = 0

    def __call__(self) -> tuple[int, int]:
        trace = self._lengths.trace
        if trace is not None:
            pair = trace.pairs[self._next % len(trace.pairs)]
            self._next += 1
            return pair
        return self._lengths.prompt.sample(self._rng), self._lengths.output.sample(self._rng)


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Open-loop inter-arrival times: gamma with the given coefficient of
    variation (cv = 1 is Poisson; cv > 1 is burstier)."""

    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.cv <= 0:
            raise ValueError("arrival rate and cv must be > 0")

    def gaps_s(self, rng: random.Random, n: int) -> list[float]:
        if self.cv == 1.0:
            return [rng.expovariate(self.rate_per_s) for _ in range(n)]
        shape = 1.0 / self.cv**2
        scale = 1.0 / (self.rate_per_s * shape)
        return [rng.gammavariate(shape, scale) for _ in range(n)]

    def times_s(
        self, rng: random.Random, horizon_s: float, limit: int | None = None
    ) -> list[float]:
        """Arrival instants in [0, horizon_s), at most `limit` of them."""
        out: list[float] = []
        t = 0.0
        cap = limit if limit is not None else math.inf
        while len(out) < cap:
            t += self.gaps_s(rng, 1)[0]
            if t >= horizon_s:
                break
            out.append(t)
        return out


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    share: float = 1.0
    api_key: str | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        md = [("x-fairgate-tenant", self.name)]
        if self.api_key:
            md.append(("authorization", f"Bearer {self.api_key}"))
        return tuple(md)


def parse_tenant(spec: str) -> Tenant:
    """`NAME[:SHARE[:KEY]]`; KEY `env:VAR` reads the API key from $VAR."""
    parts = spec.split(":", 2)
    name = parts[0].strip()
    if not name:
        raise ValueError(f"bad tenant {spec!r}: empty name")
    share = 1.0
    if len(parts) > 1 and parts[1]:
        try:
            share = float(parts[1])
        except ValueError:
            raise ValueError(f"bad tenant {spec!r}: share must be a number") from None
        if share <= 0:
            raise ValueError(f"bad tenant {spec!r}: share must be > 0")
    key: str | None = None
    if len(parts) > 2 and parts[2]:
        key = parts[2]
        if key.startswith("env:"):
            var = key[4:]
            key = os.environ.get(var)
            if not key:
                raise ValueError(f"tenant {name!r}: environment variable {var} is not set")
    return Tenant(name, share, key)


class TenantPicker:
    def __init__(self, tenants: Sequence[Tenant], rng: random.Random) -> None:
        if not tenants:
            raise ValueError("at least one tenant is needed")
        self.tenants = list(tenants)
        self._weights = [t.share for t in tenants]
        self._rng = rng

    def __call__(self) -> Tenant:
        if len(self.tenants) == 1:
            return self.tenants[0]
        return self._rng.choices(self.tenants, weights=self._weights)[0]


def prompt_ids(n: int, rng: random.Random, vocab_size: int = 32000) -> list[int]:
    """A token-id prompt of exactly n tokens (ids well inside the vocabulary)."""
    hi = max(2, min(vocab_size, 32000) - 1)
    return [rng.randrange(1, hi) for _ in range(n)]


# Ids below this are special in most vocabularies.
FIRST_PLAIN_ID = 256


def distinct_prompt_ids(index: int, n: int, vocab_size: int = 32000) -> list[int]:
    """Request `index`'s n prompt ids, sharing no prefix with any other request's
    among `vocab_size - 256` consecutive ones (its first id is its own), so that the
    engine's prefix cache finds nothing: a trace without shared prefixes.
    (One id repeated would make every prompt a prefix of every longer one.)"""
    span = vocab_size - FIRST_PLAIN_ID
    return [FIRST_PLAIN_ID + (index + k) % span for k in range(n)]
