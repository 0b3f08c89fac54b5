"""The serving settings: listening, the engine kind, the model and the stream.

A group of `Settings` (service/settings.py), declared apart; its fields come
first in the operators' table and the serve flags.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from service.event_loop import EVENT_LOOPS
from service.settings_errors import OneOf
from service.settings_field import setting as _s

ENGINES = ("simulator", "sglang-http", "sglang")
# Server processes per node (`workers`): beyond the cores of any node we run on.
MAX_WORKERS = 256


class ServingSettings(BaseModel):
    listen: str = _s("127.0.0.1:50051", "gRPC address, host:port (port 0 picks a free one).")
    http_listen: str = _s(
        "127.0.0.1:8000",
        "OpenAI-compatible HTTP API host:port (/v1/chat/completions, /v1/completions, "
        '/v1/models); "" = off, port 0 picks a free one.',
    )
    metrics_listen: str = _s(
        "", 'Prometheus scrape endpoint host:port; "" = off, port 0 picks a free one.'
    )
    engine: Annotated[str, OneOf(ENGINES)] = _s(
        "simulator", "simulator (embedded), sglang-http (SGLang servers), sglang (in-process)."
    )
    model_name: str = _s("", "Model name clients use; empty: the simulator preset's name.")
    event_loop: Annotated[str, OneOf(EVENT_LOOPS)] = _s(
        "auto", "Event loop: auto (uvloop when installed), uvloop, asyncio."
    )
    gc_freeze: bool = _s(
        True,
        "Once started, take what start built out of Python's garbage collector "
        "(gc.freeze): a full collection then skips ~90 000 objects that never become "
        "garbage, instead of stalling every stream for 40-150 ms.",
    )
    workers: int = _s(
        1,
        "Server processes on this node, all on the same ports (SO_REUSEPORT); "
        "more than 1 needs store=redis.",
        ge=1,
        le=MAX_WORKERS,
    )
    shutdown_grace_s: float = _s(
        30.0, "On SIGTERM, how long streams in flight get to finish.", ge=0, le=3600
    )
    keepalive_time_s: float = _s(30.0, "gRPC keepalive ping interval.", gt=0)
    keepalive_timeout_s: float = _s(10.0, "gRPC keepalive ping timeout.", gt=0)
    max_concurrent_streams: int = _s(0, "gRPC streams per connection (0: no limit).", ge=0)
    max_request_bytes: int = _s(
        1 << 20,
        "Largest request, checked by the application (INVALID_ARGUMENT with details).",
        ge=1,
    )
    max_receive_message_bytes: int = _s(
        4 << 20, "Transport limit on a received message (above max_request_bytes).", ge=1
    )
    max_send_message_bytes: int = _s(4 << 20, "Transport limit on a sent message.", ge=1)
    default_max_tokens: int = _s(256, "Output tokens when a request sets none.", ge=1)
    max_output_tokens: int = _s(8192, "Most output tokens one request may ask for.", ge=1)
    tokenizer_path: str = _s(
        "",
        "Hugging Face tokenizer.json (or its directory) for exact counts and its chat "
        "template; empty: approximate counts.",
    )
    chat_template_path: str = _s(
        "",
        "Jinja2 chat template file; overrides the tokenizer directory's (neither: fairgate's "
        "ChatML).",
    )
    stream_coalesce: bool = _s(
        True, "Send tokens that are ready together in one message (never waits for more)."
    )
    stream_coalesce_window_ms: float = _s(
        0.0,
        "SGLang over HTTP: after each message, let tokens gather this long (first token "
        "never held; 0: send what each read brings).",
        ge=0,
        le=1000,
    )
