"""A replay runs with the cyclic collector off, and leaves it as it found it."""

from __future__ import annotations

import gc

import pytest
from fairgate.bench.collector import collector_off


def test_the_collector_is_off_during_the_replay_only() -> None:
    assert gc.isenabled()
    with collector_off():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_in_the_replay_turns_it_back_on() -> None:
    with pytest.raises(RuntimeError), collector_off():
        raise RuntimeError("the gateway went away")
    assert gc.isenabled()


def test_a_collector_found_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_off():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
