"""Settings: embedded defaults, env overrides, validation."""

from __future__ import annotations

import pytest

from service.settings import Settings


def test_defaults_need_no_configuration() -> None:
    s = Settings.from_env({})
    assert s.engine == "simulator" and s.listen == "127.0.0.1:50051"


def test_env_then_overrides() -> None:
    env = {"FAIRGATE_SIM_TIME_SCALE": "0.5", "FAIRGATE_LISTEN": "0.0.0.0:1"}
    s = Settings.from_env(env, listen="127.0.0.1:2", policy=None)
    assert s.sim_time_scale == 0.5 and s.listen == "127.0.0.1:2" and s.policy == "vtc"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAIRGATE_SIM_TIME_SCALE": "fast"}, "FAIRGATE_SIM_TIME_SCALE"),
        ({"FAIRGATE_SIM_TIME_SCALE": "-1"}, "sim_time_scale"),
        ({"FAIRGATE_KV_TARGET_FRACTION": "1.5"}, "kv_target_fraction"),
        ({"FAIRGATE_ENGINE": "tpu"}, "unknown engine"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)
