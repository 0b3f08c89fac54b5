"""How `fairgate bench fleet` sends one request of the plan through a gateway:
fairgate's gRPC `Generate` (token ids, the tenant in `x-fairgate-tenant`), or
SGLang's native `POST /generate` with `input_ids` through smg (which knows no
tenants: the client keeps them). Both fill a `FleetRecord` as the stream
arrives, in simulated seconds, and return the output ids (the next turn of a
conversation re-sends them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Protocol

import aiohttp
import grpc

from fairgate.bench.fairness_metrics import RequestRecord
from fairgate.bench.generate_record import record_stream
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Clock:
    """Simulated seconds since wall time `t0` (wall = simulated x `time_scale`)."""

    t0: float
    time_scale: float
    wall: Callable[[], float]

    def __call__(self) -> float:
        return (self.wall() - self.t0) / self.time_scale


@dataclass
class FleetRecord(RequestRecord):
    @property
    def completed(self) -> bool:
        return self.cached_tokens is not None and not (self.rejected or self.failed)


class Sender(Protocol):
    async def __call__(self, rec: FleetRecord, ids: Sequence[int], now_s: Clock) -> list[int]:
        """Stream one request into `rec`; return its output ids."""
        ...


WARM_IDS = (1000, 1001, 1002, 1003)


async def warm(send: Sender, tenant: str) -> None:
    """Open the gateway's connections to every worker before the clock starts (a
    first request pays for them, and would be a solo run's p99): a few one-token
    requests of a prompt that shares nothing with the plan's."""
    clock = Clock(0.0, 1.0, lambda: 0.0)
    for _ in range(4):
        rec = FleetRecord(tenant, 0.0, len(WARM_IDS), 1)
        await send(rec, WARM_IDS, clock)
        if rec.failed:
            raise RuntimeError(f"the gateway failed a warm-up request: {rec.failed}")


class GrpcSender:
    """fairgate: request i to replica i mod N (several replicas behind a plain
    round-robin balancer), two connections per replica."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._channels = [grpc.aio.insecure_channel(a) for a in addresses for _ in range(2)]
        self._stubs = [pb_grpc.InferenceServiceStub(ch) for ch in self._channels]
        self._replicas = len(addresses)
        self._next = count()

    async def __call__(self, rec: FleetRecord, ids: Sequence[int], now_s: Clock) -> list[int]:
        i = next(self._next)
        stub = self._stubs[(i % self._replicas) * 2 + (i // self._replicas) % 2]
        req = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=ids),
            return_token_ids=True,
            sampling=pb.SamplingParams(max_tokens=rec.max_tokens, ignore_eos=True),
        )
        call = stub.Generate(req, metadata=(("x-fairgate-tenant", rec.tenant),))
        return await record_stream(rec, call, now_s, now_s.time_scale)

    async def aclose(self) -> None:
        for ch in self._channels:
            await ch.close()


class SseSender:
    """SGLang's `/generate` SSE through one gateway URL (smg). The workers stream
    cumulative output (SGLang's default): each chunk carries every id so far."""

    def __init__(self, url: str) -> None:
        self._url = url.rstrip("/") + "/generate"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
        )

    async def __call__(self, rec: FleetRecord, ids: Sequence[int], now_s: Clock) -> list[int]:
        body = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": rec.max_tokens, "ignore_eos": True},
            "stream": True,
        }
        out: list[int] = []
        try:
            async with self._session.post(self._url, json=body) as r:
                if r.status != 200:
                    rec.failed = f"HTTP_{r.status}"
                    return out
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    t = now_s()
                    chunk = json.loads(line[6:])
                    meta = chunk.get("meta_info") or {}
                    new = chunk.get("output_ids") or []
                    if len(new) > len(out):
                        if rec.first_token_s is None:
                            # No queue wait to read: admission ~ the first token.
                            rec.first_token_s = rec.admitted_s = t
                        rec.token_times.append((t, len(new) - len(out)))
                        out = list(new)
                    finish = (meta.get("finish_reason") or {}).get("type")
                    if finish == "abort" or "error" in chunk:
                        rec.failed = "ABORT"
                    elif finish is not None:
                        rec.done_s = t
                        rec.cached_tokens = int(meta.get("cached_tokens") or 0)
        except (aiohttp.ClientError, TimeoutError) as exc:
            rec.failed = type(exc).__name__
        return out

    async def aclose(self) -> None:
        await self._session.close()
