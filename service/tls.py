"""TLS on the server port: a certificate and key, and optionally a client CA (mutual TLS)."""

from __future__ import annotations

from pathlib import Path

import grpc

from service.settings import Settings


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the TLS {what} {path!r}: {exc.strerror}") from exc


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """None for plaintext; with `tls_client_ca_file`, clients must present a certificate."""
    if not settings.tls_cert_file:
        return None
    cert = _read(settings.tls_cert_file, "certificate")
    key = _read(settings.tls_key_file, "key")
    client_ca = (
        _read(settings.tls_client_ca_file, "client CA") if settings.tls_client_ca_file else None
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
