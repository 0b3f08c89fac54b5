"""Builds the configured engine from settings."""

from __future__ import annotations

from service.engines.protocol import Engine
from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.staged_prefill import StagedPrefill
from service.settings import Settings


def build_engine(settings: Settings) -> tuple[Engine, str]:
    """Return the engine and the model name it serves."""
    if settings.engine == "simulator":
        cost = preset(settings.sim_gpu, settings.sim_model)
        config = SimConfig(
            cost=cost,
            max_running_requests=settings.sim_max_running_requests,
            chunked_prefill_size=settings.sim_chunked_prefill_tokens,
            mean_output_tokens=settings.sim_mean_output_tokens or None,
            seed=settings.sim_seed,
            kv_capacity_tokens=settings.sim_kv_capacity_tokens or None,
            priority_scheduling=settings.sim_priority_scheduling,
            priority_preemption_threshold=(
                None if settings.sim_disable_priority_preemption else SGLANG_PREEMPTION_THRESHOLD
            ),
        )
        engine = SimulatedEngine(
            config,
            time_scale=settings.sim_time_scale,
            coalesce=settings.stream_coalesce,
            staged_prefill=staged_prefill(settings),
        )
        return engine, settings.model_name or cost.model.name
    if settings.engine == "sglang-http":
        from service.sglang_factory import build_sglang_http

        return build_sglang_http(settings, staged_prefill(settings)), settings.model_name
    if settings.engine == "sglang":
        from service.sglang_inproc_build import build_sglang_inproc

        return build_sglang_inproc(settings), settings.model_name
    raise ValueError(f"unknown engine {settings.engine!r}")


def staged_prefill(settings: Settings) -> StagedPrefill:
    """Staged prefill from settings; text prompts only with an exact tokenizer (the
    stages go as token ids, which must be a prefix of the engine's tokenization)."""
    return StagedPrefill(
        min_tokens=settings.staged_prefill_min_tokens,
        stage_tokens=settings.staged_prefill_stage_tokens,
        sheltered_stage_tokens=settings.staged_prefill_sheltered_stage_tokens,
        short_first=settings.staged_prefill_short_first,
        one_at_a_time=settings.staged_prefill_one_at_a_time,
        cold_only=settings.staged_prefill_cold_only,
        exact_ids=settings.engine == "simulator" or bool(settings.tokenizer_path),
    )
