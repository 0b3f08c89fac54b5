"""engine=sglang's settings → sglang.Engine keywords, and what is refused before SGLang starts
(the real engine is started in tests/sglang/test_inproc_serve.py)."""

from __future__ import annotations

import json

import pytest

from service.settings import Settings, SettingsError
from service.sglang_inproc_build import ENGINE_KEYWORDS, check_model_path, engine_kwargs
from service.startup import StartupError


def inproc(**overrides: object) -> Settings:
    return Settings(engine="sglang", sglang_model_path="org/model", **overrides)


def test_defaults_leave_sglang_its_own_choices() -> None:
    assert engine_kwargs(inproc()) == {
        "model_path": "org/model",
        "incremental_streaming_output": True,
    }


def test_each_explicit_setting_becomes_its_engine_keyword() -> None:
    kwargs = engine_kwargs(
        inproc(
            sglang_tokenizer_path="org/tok",
            sglang_context_length=4096,
            sglang_mem_fraction=0.8,
            sglang_chunked_prefill_size=-1,
            sglang_max_running_requests=64,
            sglang_priority_scheduling=True,
            sglang_engine_args=json.dumps({"device": "cpu", "incremental_streaming_output": False}),
        )
    )
    assert kwargs == {
        "model_path": "org/model",
        "tokenizer_path": "org/tok",
        "context_length": 4096,
        "mem_fraction_static": 0.8,
        "chunked_prefill_size": -1,
        "max_running_requests": 64,
        "enable_priority_scheduling": True,
        "device": "cpu",
        # The JSON may turn the deltas off (the adapter follows the engine's mode).
        "incremental_streaming_output": False,
    }
    assert set(ENGINE_KEYWORDS) <= set(Settings.model_fields)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("{", "not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"context_length": 8}', "use sglang_context_length"),
        ('{"model_path": "x"}', "sglang_model_path"),
    ],
)
def test_engine_args_that_are_refused_name_the_setting(args: str, says: str) -> None:
    with pytest.raises(StartupError) as caught:
        engine_kwargs(inproc(sglang_engine_args=args))
    assert caught.value.setting == "sglang_engine_args" and says in str(caught.value)


@pytest.mark.parametrize("path", ["/no/such/model", "./nope", "a/b/c"])
def test_a_local_model_path_that_is_not_there_is_refused(path: str) -> None:
    with pytest.raises(StartupError) as caught:
        check_model_path(path)
    assert caught.value.setting == "sglang_model_path"


def test_a_hugging_face_id_or_an_existing_folder_is_left_to_sglang(tmp_path: object) -> None:
    check_model_path("meta-llama/Llama-3.1-8B-Instruct")
    check_model_path(str(tmp_path))


def test_one_process_only() -> None:
    with pytest.raises(SettingsError, match="workers must be 1"):
        Settings.from_env({}, engine="sglang", sglang_model_path="m", workers=2, store="redis")
