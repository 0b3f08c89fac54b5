"""Fixtures for tests against the SGLang stand-in on loopback."""

from tests.sglang_helpers import start_sim

__all__ = ["start_sim"]
