"""fairgate: Python client for the fairgate multi-tenant inference gateway."""

from fairgate.aio import AsyncClient
from fairgate.errors import FairgateError
from fairgate.sync import Client
from fairgate.tls import TlsConfig
from fairgate.types import Completion, Delta, ModelInfo, Result, Timings, Usage

__all__ = [
    "AsyncClient",
    "Client",
    "Completion",
    "Delta",
    "FairgateError",
    "ModelInfo",
    "Result",
    "Timings",
    "TlsConfig",
    "Usage",
]
__version__ = "0.1.0"
