"""The simulator's continuous-batching model, steppable and clock-free.

One `step()` is one engine iteration, as in SGLang: admit waiting requests
FCFS while KV blocks allow, run up to `chunked_prefill_size` prompt tokens of
prefill alongside one decode token per running request, and return how long
that iteration takes on the modelled GPU plus the tokens it produced. The
async engine sleeps that long (times a time scale); tests may drive it with a
fake clock instead.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field

from service.engines.protocol import EngineCapacity, FinishKind, SamplingOptions
from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD
from service.engines.simulator import vocab
from service.engines.simulator.hardware import CostModel
from service.engines.simulator.kv import KvPool
from service.engines.simulator.radix import CacheObserver, Node
from service.engines.stop import StopMatcher


@dataclass(frozen=True, slots=True)
class SimConfig:
    cost: CostModel
    max_running_requests: int = 256
    chunked_prefill_size: int = 2048
    # None: unbounded, like SGLang's default --max-queued-requests.
    max_queued_requests: int | None = None
    vocab_size: int = 32000
    # Mean output length when EOS may end a request; None: only length/stop end it.
    mean_output_tokens: float | None = None
    # Part of the remaining output budget reserved at admission (SGLang's new_token_ratio).
    new_token_ratio: float = 0.4
    kv_capacity_tokens: int | None = None
    seed: int = 0
    # SGLang's --enable-priority-scheduling: requests waiting for their prefill
    # go by priority (larger first), then arrival; a request whose prefill is
    # under way (chunked) finishes it first.
    priority_scheduling: bool = False
    # With it, a waiting request that finds no room retracts running requests
    # whose priority it exceeds by more than this (lowest priority, then the
    # latest arrival, first), as SGLang's --priority-scheduling-preemption-threshold
    # (default 10); None: --disable-priority-preemption.
    priority_preemption_threshold: int | None = SGLANG_PREEMPTION_THRESHOLD
    # SGLang's radix cache (off: --disable-radix-cache).
    prefix_cache: bool = True

    @property
    def kv_capacity(self) -> int:
        return self.kv_capacity_tokens or self.cost.kv_capacity_tokens

    def engine_capacity(self) -> EngineCapacity:
        """What an engine of this configuration reports (SGLang's /server_info)."""
        return EngineCapacity(
            max_running_requests=self.max_running_requests,
            max_total_tokens=self.kv_capacity,
            max_context_tokens=min(self.cost.model.max_context_tokens, self.kv_capacity),
            vocab_size=self.vocab_size,
            preempt_threshold=(
                self.priority_preemption_threshold if self.priority_scheduling else None
            ),
        )


class _State(enum.Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingOptions
    rng: random.Random
    stop: StopMatcher
    output_ids: list[int] = field(default_factory=list)
    # Tokens of (prompt + generated) materialized in the KV cache, cached ones included.
    in_kv: int = 0
    # The leading part of in_kv held in the prefix tree, locked through `node` (kv.py).
    tree_len: int = 0
    node: Node | None = None
    # Prompt tokens served from the prefix cache, as SGLang's meta_info reports them.
    cached_tokens: int = 0
    # in_kv when admitted (its cached prefix): the prefill is under way past it.
    prefill_from: int = 0
    state: _State = _State.WAITING
    preemptions: int = 0
    priority: int = 0
    seq: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def generated(self) -> int:
        return len(self.output_ids)

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.generated


# An emission's token id when it carries no token (a prefill-only end, an abort).
NO_TOKEN = -1


@dataclass(slots=True)
class Emission:
    rid: str
    token_id: int
    text: str
    generated: int
    finish: FinishKind | None = None
    stop_matched: str = ""


@dataclass(slots=True)
class StepResult:
    duration_s: float
    emissions: list[Emission] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_batch: int = 0


class QueueFull(Exception):
    pass


class SimCore:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.capacity = config.kv_capacity
        self.max_context = min(config.cost.model.max_context_tokens, self.capacity)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._by_rid: dict[str, SimRequest] = {}
        self.kv = KvPool(self.capacity, prefix_cache=config.prefix_cache)
        self.kv_observer: CacheObserver | None = None  # `observe_cache`
        self.preemptions = 0
        self._eos_p = 1.0 / config.mean_output_tokens if config.mean_output_tokens else 0.0
        self._seed_rng = random.Random(config.seed)
        self._seq = 0

    # -- requests -----------------------------------------------------------
    def make_request(
        self,
        rid: str,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampling: SamplingOptions,
        priority: int = 0,
    ) -> SimRequest:
        return SimRequest(
            rid=rid,
            prompt_ids=list(prompt_ids),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            rng=random.Random(self._text_seed(prompt_ids, sampling)),
            stop=StopMatcher(sampling.stop),
            priority=priority if self.config.priority_scheduling else 0,
        )

    def _text_seed(self, prompt_ids: list[int], sampling: SamplingOptions) -> str | int:
        """What the text follows, as a model's sampling would: a request's seed with its
        temperature (another temperature samples other words), the prompt alone when
        greedy (temperature 0), else a fresh draw from the engine's seed."""
        if sampling.temperature == 0.0:
            return f"greedy:{','.join(map(str, prompt_ids))}"
        if sampling.seed is not None:
            # A str seeds `random` through SHA-512: the same in every process.
            return f"{sampling.seed}:{sampling.temperature!r}"
        return self._seed_rng.getrandbits(32)

    def add(self, req: SimRequest) -> None:
        limit = self.config.max_queued_requests
        if limit is not None and len(self.waiting) >= limit:
            raise QueueFull(f"simulator queue is full ({limit} waiting)")
        if req.rid in self._by_rid:
            raise ValueError(f"duplicate request id {req.rid!r}")
        self._by_rid[req.rid] = req
        self._seq += 1
        req.seq = self._seq
        self._enqueue(req)

    def _enqueue(self, req: SimRequest) -> None:
        # Behind every request of its priority or more (FCFS among equals).
        at = len(self.waiting)
        while at > 0 and self.waiting[at - 1].priority < req.priority:
            at -= 1
        self.waiting.insert(at, req)

    def abort(self, rid: str) -> bool:
        req = self._by_rid.pop(rid, None)
        if req is None:
            return False
        if req.state is _State.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
            # SGLang finishes an aborted request like any other: the tree keeps its KV.
            self.kv.release(req, insert=True)
        return True

    @property
    def used_kv(self) -> int:
        """KV tokens in use, evictable cache excluded (SGLang's num_used_tokens)."""
        return self.kv.used

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def flush_cache(self) -> bool:
        """Empty the prefix cache, only when idle (SGLang's /flush_cache)."""
        if not self.idle:
            return False
        self.kv = KvPool(self.capacity, prefix_cache=self.config.prefix_cache)
        self.kv.tree.observer = self.kv_observer
        if self.kv_observer is not None:
            self.kv_observer.cleared()
        return True

    def observe_cache(self, observer: CacheObserver) -> None:
        """Tell `observer` what the prefix cache stores and evicts from now on."""
        self.kv_observer = self.kv.tree.observer = observer

    # -- one iteration ------------------------------------------------------
    @staticmethod
    def _prefill_order(req: SimRequest) -> tuple[bool, int, int]:
        # A chunked prefill under way first (SGLang continues it), then priority.
        return (req.in_kv == req.prefill_from, -req.priority, req.seq)

    def _reserved(self, req: SimRequest) -> float:
        remaining = req.max_new_tokens - req.generated
        return req.context_len - req.in_kv + self.config.new_token_ratio * remaining

    def _admit(self) -> None:
        cfg = self.config
        headroom = self.capacity - self.used_kv - sum(self._reserved(r) for r in self.running)
        # As SGLang's scheduling pass: only what ran before it may be retracted,
        # and what it retracts waits again only after it (no retraction ping-pong).
        preemptible = list(self.running)
        retracted: list[SimRequest] = []
        while self.waiting:
            head = self.waiting[0]
            used = self.kv.used
            self.kv.admit(head)  # lock its cached prefix: no longer evictable room
            need = self._reserved(head) + self.kv.used - used
            slots_full = len(self.running) >= cfg.max_running_requests
            if slots_full or (need > headroom and self.running):
                freed = self._preempt_by_priority(
                    head, need - headroom, slots_full, preemptible, retracted
                )
                if freed is None:
                    self.kv.release(head, insert=False)
                    break
                headroom += freed
            self.waiting.popleft()
            head.prefill_from = head.in_kv
            if head.preemptions == 0:  # counted once, as SGLang's retracted_stain
                head.cached_tokens = head.in_kv
            head.state = _State.PREFILL
            self.running.append(head)
            headroom -= need
        for r in retracted:
            self._enqueue(r)

    def _preempt_by_priority(
        self,
        head: SimRequest,
        tokens_short: float,
        slot_needed: bool,
        preemptible: list[SimRequest],
        retracted: list[SimRequest],
    ) -> float | None:
        """Retract running requests to make room for `head`, as SGLang's
        priority preemption does; the KV tokens freed, or None (nothing retracted)
        if no set of preemptible requests would make enough room."""
        threshold = self.config.priority_preemption_threshold
        if not self.config.priority_scheduling or threshold is None:
            return None
        chosen: list[SimRequest] = []
        freed = 0.0
        for r in sorted(preemptible, key=lambda r: (r.priority, -r.seq)):
            if head.priority - r.priority <= threshold:
                break
            if freed >= tokens_short and (chosen or not slot_needed):
                break
            chosen.append(r)
            freed += r.in_kv + self._reserved(r)
        if not chosen or freed < tokens_short:
            return None
        for r in chosen:
            preemptible.remove(r)
            self.running.remove(r)
            self._retract(r)
            retracted.append(r)
        return freed

    def _retract(self, victim: SimRequest) -> None:
        """Free a running request's KV; it waits to be prefilled again (prompt and
        the output so far), behind the waiting requests of its priority or more."""
        self.kv.release(victim, insert=False)
        victim.state = _State.WAITING
        victim.preemptions += 1
        self.preemptions += 1

    def _preempt_for(self, extra_tokens: int) -> None:
        # Out of KV: retract the most recently admitted requests, as SGLang does.
        while self.used_kv + extra_tokens > self.capacity and len(self.running) > 1:
            victim = self.running.pop()
            self._retract(victim)
            self.waiting.appendleft(victim)

    def step(self) -> StepResult:
        self._admit()
        if not self.running:
            return StepResult(duration_s=0.0)
        decoding = [r for r in self.running if r.state is _State.DECODE]
        self._preempt_for(len(decoding))
        decoding = [r for r in self.running if r.state is _State.DECODE]
        budget = self.config.chunked_prefill_size
        prefill_tokens = 0
        finished_prefill: list[SimRequest] = []
        prefilling = [r for r in self.running if r.state is _State.PREFILL]
        if self.config.priority_scheduling:
            prefilling.sort(key=self._prefill_order)
        for req in prefilling:
            if budget <= 0:
                break
            take = min(budget, req.context_len - req.in_kv, self.kv.available)
            if take <= 0:
                break
            self.kv.alloc(req, take)
            self.kv.checkpoint(req)
            budget -= take
            prefill_tokens += take
            if req.in_kv == req.context_len:
                finished_prefill.append(req)
        context = sum(r.in_kv for r in self.running)
        result = StepResult(
            duration_s=self.config.cost.step_s(prefill_tokens, len(decoding), context),
            prefill_tokens=prefill_tokens,
            decode_batch=len(decoding),
        )
        for req in finished_prefill:
            req.state = _State.DECODE
        # A finished prefill yields the request's next token in the same pass;
        # a prefill-only request (max_new_tokens 0, as SGLang takes it) ends there,
        # its whole prompt left in the tree (its KV was computed).
        for req in decoding + finished_prefill:
            if req.max_new_tokens == 0:
                self._release(req)
                result.emissions.append(
                    Emission(req.rid, NO_TOKEN, "", 0, finish=FinishKind.LENGTH)
                )
                continue
            result.emissions.append(self._next_token(req))
        return result

    def _next_token(self, req: SimRequest) -> Emission:
        s = req.sampling
        min_done = req.generated >= s.min_tokens
        token = vocab.sample_token(req.rng)
        if self._eos_p and not s.ignore_eos and min_done and req.rng.random() < self._eos_p:
            token = vocab.EOS_TOKEN_ID
        req.output_ids.append(token)
        self.kv.alloc(req, 1)
        text, matched = req.stop.feed(vocab.piece(token))
        em = Emission(rid=req.rid, token_id=token, text=text, generated=req.generated)
        if token == vocab.EOS_TOKEN_ID:
            em.finish = FinishKind.STOP
        elif min_done and token in s.stop_token_ids:
            em.finish, em.stop_matched = FinishKind.STOP, str(token)
        elif matched is not None and min_done:
            em.finish, em.stop_matched = FinishKind.STOP, matched
        elif req.generated >= req.max_new_tokens or req.context_len >= self.max_context:
            em.finish = FinishKind.LENGTH
            em.text += req.stop.flush()
        if em.finish is not None:
            self._release(req)
        return em

    def _release(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._by_rid.pop(req.rid, None)
        self.kv.release(req, insert=True)
