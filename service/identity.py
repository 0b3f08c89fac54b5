"""Who the current RPC is, as the auth interceptor decided (a context variable).

Its own module, with no imports, so telemetry can read it without importing
the authenticator (which imports the error mapping, which imports telemetry).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    # "" → the default tenant (open mode only).
    tenant_id: str
    # "api-key", "header", "anonymous" or "admin".
    via: str
    key_id: str = ""


# Unset (None) while the call is unauthenticated: refused by the interceptor.
current_identity: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "fairgate_identity", default=None
)
