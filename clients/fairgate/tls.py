"""Client-side TLS: server verification (a root CA) and optional client certificates (mTLS)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """`TlsConfig()` verifies the server against the system roots.

    ca_file: PEM root certificate(s) to verify the server with.
    cert_file / key_file: this client's certificate and key (mutual TLS).
    server_name: the name to check in the server certificate (default: the host).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key (cert_file and key_file)")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror}") from exc


TlsArg = TlsConfig | bool | None


def resolve(tls: TlsArg) -> TlsConfig | None:
    if tls is True:
        return TlsConfig()
    return tls or None


def aio_channel(
    target: str, tls: TlsArg, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    cfg = resolve(tls)
    if cfg is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, cfg.credentials(), options=[*options, *cfg.options()])


def sync_channel(target: str, tls: TlsArg, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    cfg = resolve(tls)
    if cfg is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, cfg.credentials(), options=[*options, *cfg.options()])
