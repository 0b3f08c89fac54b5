"""TLS on the server ports: a certificate and key, and optionally a client CA (mutual TLS).

The same files secure the gRPC port and the OpenAI HTTP port. They are checked
with Python's `ssl` (OpenSSL) first, so a missing or malformed file is one line
naming its setting (StartupError), not grpc-core's log lines.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from service.settings import Settings
from service.startup import StartupError


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise StartupError(setting, f"cannot read {path!r}: {exc.strerror}") from None


def _context(settings: Settings) -> ssl.SSLContext:
    """The server context from the settings' files, each checked (StartupError)."""
    for path, setting in (
        (settings.tls_cert_file, "tls_cert_file"),
        (settings.tls_key_file, "tls_key_file"),
    ):
        _read(path, setting)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    except ssl.SSLError as exc:
        raise StartupError(
            "tls_cert_file",
            f"{settings.tls_cert_file!r} and {settings.tls_key_file!r} are not a PEM "
            f"certificate and its key ({exc.reason or exc})",
        ) from None
    if settings.tls_client_ca_file:
        _read(settings.tls_client_ca_file, "tls_client_ca_file")
        try:
            ctx.load_verify_locations(settings.tls_client_ca_file)
        except ssl.SSLError as exc:
            raise StartupError(
                "tls_client_ca_file",
                f"{settings.tls_client_ca_file!r} is not a PEM CA certificate "
                f"({exc.reason or exc})",
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """None for plaintext; with `tls_client_ca_file`, clients must present a certificate."""
    if not settings.tls_cert_file:
        return None
    _context(settings)
    cert = _read(settings.tls_cert_file, "tls_cert_file")
    key = _read(settings.tls_key_file, "tls_key_file")
    client_ca = (
        _read(settings.tls_client_ca_file, "tls_client_ca_file")
        if settings.tls_client_ca_file
        else None
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The HTTP port's TLS, from the same settings as `server_credentials`."""
    if not settings.tls_cert_file:
        return None
    return _context(settings)
