"""TLS on the server ports: a certificate and key, and optionally a client CA (mutual TLS).

The same files secure the gRPC port and the OpenAI HTTP port.
"""

from __future__ import annotations

import ssl
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


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The HTTP port's TLS, from the same settings as `server_credentials`."""
    if not settings.tls_cert_file:
        return None
    for path, what in ((settings.tls_cert_file, "certificate"), (settings.tls_key_file, "key")):
        _read(path, what)  # the same clear error as the gRPC port
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file:
        _read(settings.tls_client_ca_file, "client CA")
        ctx.load_verify_locations(settings.tls_client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
