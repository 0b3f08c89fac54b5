"""The error mapping's hook: tell the current RPC's span how it ends."""

from __future__ import annotations

import grpc

from service.telemetry.observation import RPC_SCOPE


def record_abort(exc: Exception, code: grpc.StatusCode) -> None:
    scope = RPC_SCOPE.get()
    if scope is not None:
        scope.aborted(exc, code)
