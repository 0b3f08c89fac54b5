"""Server and client share google.rpc.Status through grpcio-status: what
`service.errors` packs, `fairgate.errors` reads back; a status rewritten on
the way (details that no longer match) costs the details, not the error."""

from __future__ import annotations

from fairgate.errors import from_rpc_error
from grpc.aio import AioRpcError, Metadata

from scheduler.errors import QuotaExceeded
from service.errors import map_error


def _as_call_error(message: str | None = None) -> AioRpcError:
    status = map_error(
        QuotaExceeded("t1", "tokens_per_min", "over 600 tokens/min", retry_after_s=1.5)
    ).to_status()
    return AioRpcError(
        status.code,
        Metadata(),
        Metadata(*status.trailing_metadata),
        status.details if message is None else message,
    )


def test_details_round_trip() -> None:
    err = from_rpc_error(_as_call_error())
    assert err.code.name == "RESOURCE_EXHAUSTED" and err.reason == "QUOTA_EXCEEDED"
    assert err.retry_after_s == 1.5
    assert err.quota_violations == (("tenant:t1", "tokens_per_min: over 600 tokens/min"),)


def test_a_rewritten_status_keeps_the_error_without_details() -> None:
    err = from_rpc_error(_as_call_error("changed by a proxy"))
    assert err.code.name == "RESOURCE_EXHAUSTED" and err.message == "changed by a proxy"
    assert err.reason == "" and err.retry_after_s is None
