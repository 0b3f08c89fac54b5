"""Fixtures for tests against the SGLang stand-in on loopback."""

from tests.sglang_helpers import start_sim
from tests.telemetry_helpers import captured

__all__ = ["captured", "start_sim"]
