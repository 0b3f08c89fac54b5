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
        # Issue #14: the same finite ranges as tenants' weights and quotas.
        ({"FAIRGATE_VTC_W_IN": "inf"}, "vtc_w_in must be a finite number"),
        ({"FAIRGATE_VTC_W_OUT": "5e-324"}, "vtc_w_out must be a finite number"),
        ({"FAIRGATE_RATE_LIMIT_PER_S": "1e-300"}, "rate_limit_per_s"),
        ({"FAIRGATE_RATE_LIMIT_BURST": "nan"}, "rate_limit_burst"),
        ({"FAIRGATE_DEFAULT_TENANT": "../etc"}, "default_tenant"),
        ({"FAIRGATE_SGLANG_EJECTION_BASE_S": "0"}, "sglang_ejection_base_s"),
        ({"FAIRGATE_SGLANG_EJECT_AFTER_FAILURES": "0"}, "sglang_eject_after_failures"),
        ({"FAIRGATE_WORKERS": "0"}, "workers must be in"),
        ({"FAIRGATE_IDLE_TENANT_TTL_S": "0"}, "idle_tenant_ttl_s must be in"),
        # Workers share admission through Redis: the error names the setting to change.
        ({"FAIRGATE_WORKERS": "2"}, "workers=2 needs store=redis .*FAIRGATE_STORE=redis"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)
