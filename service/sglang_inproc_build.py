"""Builds the in-process SGLang engine (`engine=sglang`) from settings.

The server flags that matter are settings of their own (`sglang_*`, one per
`sglang.Engine` keyword below); any other keyword goes in `sglang_engine_args`
(JSON). A start-up failure of the engine ends `serve` with one line that names
the setting to look at and a non-zero exit (`StartupError`), never a traceback
or a hang: a model path that is not there is refused before SGLang is imported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.engines.sglang_inproc import SglangInprocEngine
from service.settings import Settings
from service.startup import EXIT_ENVIRONMENT, StartupError

# setting -> sglang.Engine keyword; a setting's zero value ("", 0, False) leaves SGLang's default.
ENGINE_KEYWORDS = {
    "sglang_tokenizer_path": "tokenizer_path",
    "sglang_context_length": "context_length",
    "sglang_mem_fraction": "mem_fraction_static",
    "sglang_chunked_prefill_size": "chunked_prefill_size",
    "sglang_max_running_requests": "max_running_requests",
    "sglang_priority_scheduling": "enable_priority_scheduling",
}


def engine_kwargs(settings: Settings) -> dict[str, Any]:
    """The `sglang.Engine(...)` keywords: the explicit settings, then the JSON's."""
    try:
        extra = json.loads(settings.sglang_engine_args or "{}")
    except json.JSONDecodeError as exc:
        raise StartupError("sglang_engine_args", f"not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise StartupError("sglang_engine_args", "must be a JSON object of sglang.Engine keywords")
    kwargs: dict[str, Any] = {
        "model_path": settings.sglang_model_path,
        # Deltas rather than the text so far: less work per chunk in SGLang's tokenizer
        # manager, which runs in our process now (the adapter reads the mode back).
        "incremental_streaming_output": True,
    }
    for name, keyword in ENGINE_KEYWORDS.items():
        value = getattr(settings, name)
        if keyword in extra:
            raise StartupError(
                "sglang_engine_args", f"{keyword!r} has a setting of its own: use {name}"
            )
        if value:
            kwargs[keyword] = value
    if "model_path" in extra:
        raise StartupError("sglang_engine_args", "'model_path' is sglang_model_path's")
    return {**kwargs, **extra}


def check_model_path(path: str) -> None:
    """A local path must exist; anything shaped like a Hugging Face id (org/name) is
    left to SGLang, which downloads it."""
    local = path.startswith(("/", ".", "~")) or path.count("/") > 1
    if local and not Path(path).expanduser().exists():
        raise StartupError(
            "sglang_model_path", f"{path!r} does not exist (a local model folder or org/name)"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@contextmanager
def _fairgate_logging() -> Iterator[None]:
    """Keep fairgate's logging through SGLang's start-up.

    `sglang.Engine` configures logging for a process of its own: `basicConfig(force=True)`
    at its log level ("error") replaces the root logger's handlers, which would
    silence fairgate's log (and its JSON format). The handlers and level go back
    afterwards; SGLang's own loggers keep their warnings and errors (its INFO
    lists every server argument, hundreds of them)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logging.getLogger("sglang").setLevel(max(root.getEffectiveLevel(), logging.WARNING))


def build_sglang_inproc(settings: Settings) -> SglangInprocEngine:
    kwargs = engine_kwargs(settings)
    check_model_path(settings.sglang_model_path)

    def factory() -> Any:
        try:
            import sglang
        except ImportError as exc:
            raise StartupError(
                "engine",
                f"engine sglang needs SGLang in this Python ({exc}): "
                "pip install 'fairgate[sglang]' (a CUDA GPU, or SGLang's CPU engine: "
                "see docs/sglang.md)",
            ) from None
        try:
            with _fairgate_logging():
                return sglang.Engine(**kwargs)
        except TypeError as exc:  # a keyword sglang.Engine does not take
            raise StartupError(
                "sglang_engine_args", f"sglang.Engine refused it: {_first_line(exc)}"
            ) from None
        except OSError as exc:  # a model or tokenizer that cannot be read or downloaded
            raise StartupError(
                "sglang_model_path", f"SGLang could not load the model: {_first_line(exc)}"
            ) from None
        except ValueError as exc:  # SGLang's checks of its arguments, or of the model's config
            line = _first_line(exc)
            about_model = settings.sglang_model_path in line
            raise StartupError(
                "sglang_model_path" if about_model else "sglang_engine_args",
                f"SGLang refused {'the model' if about_model else 'its arguments'}: {line}",
            ) from None
        except RuntimeError as exc:  # a scheduler that died loading (out of memory, ...)
            raise StartupError(
                "engine",
                f"SGLang's engine failed to start: {_first_line(exc)} (its log is above)",
                EXIT_ENVIRONMENT,
            ) from None

    return SglangInprocEngine(factory, incremental_output=True)
