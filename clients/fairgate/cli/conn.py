"""Connection options shared by the `fairgate` client commands: API key and TLS."""

from __future__ import annotations

from typing import Annotated

import typer

from fairgate.tls import TlsConfig

ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        envvar="FAIRGATE_API_KEY",
        help="API key, sent as `authorization: Bearer`",
        show_default=False,
    ),
]
TlsOpt = Annotated[bool, typer.Option(envvar="FAIRGATE_TLS", help="use TLS (system roots)")]
CaFileOpt = Annotated[
    str | None, typer.Option(envvar="FAIRGATE_CA_FILE", help="PEM root CA (implies --tls)")
]
CertFileOpt = Annotated[
    str | None, typer.Option(envvar="FAIRGATE_CLIENT_CERT_FILE", help="client cert (mTLS)")
]
KeyFileOpt = Annotated[
    str | None, typer.Option(envvar="FAIRGATE_CLIENT_KEY_FILE", help="client key (mTLS)")
]


def tls_config(
    tls: bool, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> TlsConfig | None:
    if not (tls or ca_file or cert_file or key_file):
        return None
    try:
        return TlsConfig(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
