"""Settings: embedded defaults, env overrides, validation (every problem at once)."""

from __future__ import annotations

import pytest

from service.engine_factory import staged_prefill
from service.settings import Settings, SettingsError


def test_defaults_need_no_configuration() -> None:
    s = Settings.from_env({})
    assert s.engine == "simulator" and s.listen == "127.0.0.1:50051"
    assert s == Settings()


def test_env_then_overrides() -> None:
    env = {"FAIRGATE_SIM_TIME_SCALE": "0.5", "FAIRGATE_LISTEN": "0.0.0.0:1"}
    s = Settings.from_env(env, listen="127.0.0.1:2", policy=None)
    assert s.sim_time_scale == 0.5 and s.listen == "127.0.0.1:2" and s.policy == "vtc"


def test_variables_are_read_whatever_their_case_and_bools_strictly() -> None:
    s = Settings.from_env({"fairgate_workers": "3", "FAIRGATE_STORE": "redis"})
    assert s.workers == 3
    assert not Settings.from_env({"FAIRGATE_STREAM_COALESCE": "off"}).stream_coalesce
    # Anything else than a boolean word is a mistake, not False.
    with pytest.raises(SettingsError, match="FAIRGATE_STREAM_COALESCE='maybe': expected true"):
        Settings.from_env({"FAIRGATE_STREAM_COALESCE": "maybe"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAIRGATE_SIM_TIME_SCALE": "fast"}, "FAIRGATE_SIM_TIME_SCALE='fast': expected a number"),
        ({"FAIRGATE_SIM_TIME_SCALE": "-1"}, "FAIRGATE_SIM_TIME_SCALE='-1': expected a number >= 0"),
        ({"FAIRGATE_KV_TARGET_FRACTION": "1.5"}, r"expected a number in \(0, 1\]"),
        ({"FAIRGATE_ENGINE": "tpu"}, "expected one of simulator, sglang-http, sglang"),
        # Issue #14: the same finite ranges as tenants' weights and quotas.
        ({"FAIRGATE_VTC_W_IN": "inf"}, r"FAIRGATE_VTC_W_IN='inf': .* in \[0.001, 1000\]"),
        ({"FAIRGATE_VTC_W_OUT": "5e-324"}, r"FAIRGATE_VTC_W_OUT='5e-324': .* in \[0.001, 1000\]"),
        ({"FAIRGATE_RATE_LIMIT_PER_S": "1e-300"}, r"in \[1e-06, 1e\+06\]"),
        ({"FAIRGATE_RATE_LIMIT_BURST": "nan"}, "FAIRGATE_RATE_LIMIT_BURST='nan'"),
        ({"FAIRGATE_RATE_LIMIT_BURST": "0.5"}, "must be 0 .* or at least 1"),
        ({"FAIRGATE_DEFAULT_TENANT": "../etc"}, "FAIRGATE_DEFAULT_TENANT='../etc': .*letters"),
        ({"FAIRGATE_SGLANG_EJECTION_BASE_S": "0"}, "FAIRGATE_SGLANG_EJECTION_BASE_S='0'"),
        ({"FAIRGATE_SGLANG_EJECT_AFTER_FAILURES": "0"}, "expected an integer >= 1"),
        ({"FAIRGATE_WORKERS": "0"}, r"FAIRGATE_WORKERS='0': expected an integer in \[1, 256\]"),
        ({"FAIRGATE_IDLE_TENANT_TTL_S": "0"}, r"expected a number in \[1, 604800\]"),
        ({"FAIRGATE_LOG_LEVEL": "loud"}, "expected one of DEBUG, INFO"),
        ({"FAIRGATE_HTTP_LISTEN": "8000"}, "FAIRGATE_HTTP_LISTEN='8000': must be host:port"),
        # The shape the server binds (ports as numbers), checked with the settings.
        ({"FAIRGATE_LISTEN": "localhost"}, "FAIRGATE_LISTEN='localhost': must be host:port"),
        ({"FAIRGATE_LISTEN": "localhost:grpc"}, "FAIRGATE_LISTEN='localhost:grpc': must be"),
        ({"FAIRGATE_METRICS_LISTEN": "[::1]:65536"}, "FAIRGATE_METRICS_LISTEN='.*must be host"),
        # Workers share admission through Redis: the error names the setting to change.
        ({"FAIRGATE_WORKERS": "2"}, "workers=2 needs store=redis .*FAIRGATE_STORE=redis"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as err:
        Settings.from_env(env)
    assert len(err.value.problems) == 1


def test_every_problem_at_once_naming_variable_value_and_range() -> None:
    env = {
        "FAIRGATE_WORKERS": "abc",
        "FAIRGATE_KV_TARGET_FRACTION": "1.5",
        "FAIRGATE_ENGINE": "tpu",
        "FAIRGATE_TLS_CERT_FILE": "cert.pem",
        "FAIRGATE_API_KEY_PEPPER": "short-secret",
        "FAIRGATE_REDIS_LEASE_TTL_S": "1",
    }
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env, sim_time_scale=-1.0)
    problems = err.value.problems
    assert problems == [
        "FAIRGATE_ENGINE='tpu': expected one of simulator, sglang-http, sglang",
        "FAIRGATE_WORKERS='abc': expected an integer in [1, 256]",
        "--sim-time-scale=-1.0 (FAIRGATE_SIM_TIME_SCALE): expected a number >= 0",
        "FAIRGATE_KV_TARGET_FRACTION='1.5': expected a number in (0, 1]",
        "FAIRGATE_API_KEY_PEPPER=(hidden): api_key_pepper must be at least 16 bytes",
        "FAIRGATE_TLS_CERT_FILE='cert.pem', FAIRGATE_TLS_KEY_FILE='': "
        "tls_cert_file and tls_key_file go together",
        "FAIRGATE_REDIS_LEASE_TTL_S=1.0, FAIRGATE_REDIS_HEARTBEAT_S=1.0: "
        "redis_lease_ttl_s must be at least twice redis_heartbeat_s",
    ]
    assert str(err.value).startswith("invalid settings (7 problems):\n  FAIRGATE_ENGINE=")
    assert "short-secret" not in str(err.value)


def test_a_rule_is_not_judged_on_a_setting_that_is_itself_bad() -> None:
    # max_request_bytes (8 MiB) against the default receive limit would break the
    # rule between them; the receive limit's own error is the one to report.
    env = {"FAIRGATE_MAX_REQUEST_BYTES": str(8 << 20), "FAIRGATE_MAX_RECEIVE_MESSAGE_BYTES": "x"}
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert err.value.problems == [
        "FAIRGATE_MAX_RECEIVE_MESSAGE_BYTES='x': expected an integer >= 1"
    ]


def test_direct_construction_and_replace_validate_too() -> None:
    with pytest.raises(ValueError, match="engine sglang needs sglang_model_path"):
        Settings(engine="sglang")
    base = Settings()
    assert base.replace(workers=4, store="redis").replica_processes == 4
    with pytest.raises(SettingsError, match="FAIRGATE_WORKERS=4, FAIRGATE_STORE='memory'"):
        base.replace(workers=4)
    with pytest.raises(SettingsError, match="unknown setting"):
        base.replace(wrokers=4)


def test_unsent_slots_are_lent_only_beside_a_lent_slot() -> None:
    with pytest.raises(SettingsError, match="set both"):
        Settings().replace(fair_light_takes_unsent_slots=True)
    both = Settings().replace(fair_light_takes_unsent_slots=True, fair_light_takes_slot=True)
    assert both.fair_light_takes_unsent_slots


def test_sheltered_stages_need_staged_prefill_and_the_stagger() -> None:
    wide = {"staged_prefill_sheltered_stage_tokens": 2048}
    with pytest.raises(SettingsError, match="set staged_prefill_min_tokens"):
        Settings().replace(**wide)
    with pytest.raises(SettingsError, match="sglang_stagger_prefill_tokens too"):
        Settings().replace(staged_prefill_min_tokens=256, **wide)
    on = Settings().replace(
        staged_prefill_min_tokens=256, sglang_stagger_prefill_tokens=1024, **wide
    )
    assert staged_prefill(on).sheltered_stage_tokens == 2048
