"""One gRPC Generate stream recorded into a `RequestRecord` (bench fairness's
replay and bench fleet's gRPC sender)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable

import grpc

from fairgate.bench.fairness_metrics import RequestRecord
from fairgate.v1 import inference_pb2 as pb


async def record_stream(
    rec: RequestRecord,
    call: AsyncIterable[pb.GenerateResponse],
    now_s: Callable[[], float],
    time_scale: float,
) -> list[int]:
    """Read `call` into `rec` (times from `now_s`, simulated seconds; the server's
    queue wait is wall time, so divided by `time_scale`); return the output ids.
    RESOURCE_EXHAUSTED is a rejection, any other status but CANCELLED a failure."""
    out: list[int] = []
    try:
        async for msg in call:
            t = now_s()
            if msg.HasField("delta"):
                if rec.first_token_s is None:
                    rec.first_token_s = t
                rec.token_times.append((t, len(msg.delta.token_ids)))
                out.extend(msg.delta.token_ids)
            else:
                rec.done_s = t
                wait_s = msg.result.timings.queue_wait.ToNanoseconds() / 1e9
                rec.admitted_s = rec.sent_s + wait_s / time_scale
                rec.cached_tokens = msg.result.usage.cached_tokens
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            rec.rejected = exc.code().name
        elif exc.code() != grpc.StatusCode.CANCELLED:
            rec.failed = exc.code().name
    return out
