"""ChunkDecoder: SGLang chunk dicts (cumulative or incremental) → EngineChunks."""

from __future__ import annotations

from typing import Any

import pytest

from service.engines.protocol import EngineError, EngineRequest, FinishKind, SamplingOptions
from service.engines.sglang_chunks import (
    ChunkDecoder,
    find_key,
    priority_options,
    sampling_params,
)
from service.settings import Settings


def _meta(n: int, finish: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "r", "prompt_tokens": 3, "completion_tokens": n, "finish_reason": finish}


def _req(**sampling: Any) -> EngineRequest:
    return EngineRequest("r", [1, 2, 3], max_tokens=8, sampling=SamplingOptions(**sampling))


def test_cumulative_text_is_diffed() -> None:
    d = ChunkDecoder(_req(), incremental=False)
    a = d.decode({"text": " a", "output_ids": [5], "meta_info": _meta(1)})
    b = d.decode({"text": " a b", "output_ids": [5, 6], "meta_info": _meta(2)})
    c = d.decode({"text": " a b", "output_ids": [5, 6], "meta_info": _meta(2, {"type": "length"})})
    assert (a.text, a.token_ids, b.text, b.token_ids) == (" a", [5], " b", [6])
    assert c.finish is FinishKind.LENGTH and c.text == "" and c.completion_tokens == 2


def test_stop_string_is_held_back_and_trimmed() -> None:
    d = ChunkDecoder(_req(stop=("END",)), incremental=False)
    a = d.decode({"text": "x E", "output_ids": [1], "meta_info": _meta(1)})
    assert a.text == "x"  # "E" might start "END"
    end = {"type": "stop", "matched": "END"}
    b = d.decode({"text": "x ", "output_ids": [1, 2], "meta_info": _meta(2, end)})
    assert (b.text, b.finish, b.stop_matched) == (" ", FinishKind.STOP, "END")


def test_stop_token_and_eos() -> None:
    d = ChunkDecoder(_req(stop_token_ids=(7,)), incremental=True)
    c = d.decode(
        {"text": "", "output_ids": [7], "meta_info": _meta(1, {"type": "stop", "matched": 7})}
    )
    assert c.stop_matched == "7"
    d = ChunkDecoder(_req(), incremental=True)
    c = d.decode(
        {"text": "", "output_ids": [2], "meta_info": _meta(1, {"type": "stop", "matched": 2})}
    )
    assert c.finish is FinishKind.STOP and c.stop_matched == ""


@pytest.mark.parametrize(
    ("chunk", "retryable"),
    [
        (
            {
                "text": "",
                "output_ids": [],
                "meta_info": _meta(0, {"type": "abort", "status_code": 503}),
            },
            True,
        ),
        (
            {
                "text": "",
                "output_ids": [],
                "meta_info": _meta(0, {"type": "abort", "status_code": 400}),
            },
            False,
        ),
        ({"error": {"message": "bad", "code": 400}}, False),
        ({"text": "x", "output_ids": [1]}, False),
        ({"text": "x", "output_ids": [1], "meta_info": {"completion_tokens": "1"}}, False),
        ([1, 2], False),
    ],
)
def test_refusals_and_malformed_chunks(chunk: Any, retryable: bool) -> None:
    with pytest.raises(EngineError) as err:
        ChunkDecoder(_req(), incremental=False).decode(chunk)
    assert err.value.retryable is retryable


def test_abort_after_tokens_is_a_finish() -> None:
    d = ChunkDecoder(_req(), incremental=True)
    d.decode({"text": "a", "output_ids": [1], "meta_info": _meta(1)})
    c = d.decode(
        {"text": "", "output_ids": [], "meta_info": _meta(1, {"type": "abort", "message": "m"})}
    )
    assert c.finish is FinishKind.ABORT and c.message == "m"


def test_sampling_params_and_server_info_lookup() -> None:
    p = sampling_params(_req(seed=3, stop=("x",), min_tokens=2, ignore_eos=True))
    assert p["sampling_seed"] == 3 and p["stop"] == ["x"] and p["min_new_tokens"] == 2
    assert p["ignore_eos"] is True and p["max_new_tokens"] == 8
    assert find_key(
        {"schedule": {"enable_priority_scheduling": True}}, "enable_priority_scheduling"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, (False, None)),
        ({"enable_priority_scheduling": False}, (False, None)),
        ({"enable_priority_scheduling": True}, (True, 10)),  # SGLang's default threshold
        (
            {"enable_priority_scheduling": True, "priority_scheduling_preemption_threshold": 3},
            (True, 3),
        ),
        ({"enable_priority_scheduling": True, "disable_priority_preemption": True}, (True, None)),
        # Lower values first would invert fairgate's numbers: none are sent.
        (
            {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True},
            (False, None),
        ),
    ],
)
def test_priority_options_from_server_args(
    args: dict[str, object], expected: tuple[bool, int | None]
) -> None:
    assert priority_options(args.get) == expected


def test_sglang_settings_validation() -> None:
    with pytest.raises(ValueError, match="sglang_urls"):
        Settings(engine="sglang-http")
    with pytest.raises(ValueError, match="http"):
        Settings(engine="sglang-http", sglang_urls="127.0.0.1:30000")
    with pytest.raises(ValueError, match="sglang_model_path"):
        Settings(engine="sglang")
    env = {
        "FAIRGATE_ENGINE": "sglang-http",
        "FAIRGATE_SGLANG_URLS": "http://127.0.0.1:1,http://127.0.0.1:2",
    }
    assert Settings.from_env(env).sglang_urls.count("http") == 2
