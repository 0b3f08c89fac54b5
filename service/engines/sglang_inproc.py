"""SGLang in-process: `sglang.Engine(...).async_generate(stream=True)` behind the Engine Protocol.

Needs the optional `sglang` extra and a GPU, or SGLang's CPU engine (tested on
CPU in tests/sglang/test_inproc.py); `sglang` is imported only when the engine
is built. The chunks are the same dicts as over HTTP, so the
same `ChunkDecoder` handles cumulative or incremental output. Abort: the
tokenizer manager's `abort_request(rid=...)` plus closing the generator.
Capacity and live load come from `await tokenizer_manager.get_loads()` (the
synchronous `Engine.get_server_info()` must not run inside our event loop).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

from service.engines.protocol import (
    EngineCapacity,
    EngineChunk,
    EngineError,
    EngineLoad,
    EngineRequest,
)
from service.engines.sglang_chunks import (
    DEFAULT_VOCAB_SIZE,
    ChunkDecoder,
    find_key,
    generate_args,
    incremental_output,
    priority_options,
    served_model,
)
from service.engines.sglang_server_info import context_window

log = logging.getLogger(__name__)


def _field(obj: Any, name: str, default: Any = 0) -> Any:
    """A LoadSnapshot attribute or a dict key (SGLang versions differ)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _scheduler_info(engine: Any) -> dict[str, Any]:
    """`max_total_num_tokens`, `max_req_input_len` as the scheduler reported them."""
    result = getattr(engine, "_scheduler_init_result", None)
    infos = getattr(result, "scheduler_infos", None)
    if isinstance(infos, list) and infos and isinstance(infos[0], dict):
        return infos[0]
    legacy = getattr(engine, "scheduler_info", None)  # SGLang before 0.5
    return legacy if isinstance(legacy, dict) else {}


class SglangInprocEngine:
    kind = "sglang"

    def __init__(self, factory: Callable[[], Any], *, incremental_output: bool = False) -> None:
        # `factory` builds the sglang.Engine (or anything with its async API).
        self._factory = factory
        self.engine: Any = None
        self.incremental = incremental_output
        self.served_model_name = ""
        # The model's local folder when it has a tokenizer.json (exact counts, chat template).
        self.tokenizer_dir = ""
        self._capacity: EngineCapacity | None = None
        self._live: dict[str, str] = {}  # request id -> SGLang rid
        self.send_priority = False

    async def start(self) -> None:
        if self.engine is None:
            self.engine = self._factory()
        try:
            await self._read_capacity()
        except BaseException:
            await self.aclose()  # the scheduler and detokenizer processes go with it
            raise

    async def _read_capacity(self) -> None:
        _own_signals(self.engine.tokenizer_manager)
        args = getattr(self.engine, "server_args", None)
        threshold: int | None = None
        if args is not None:

            def get(key: str) -> Any:
                return getattr(args, key, None)

            self.served_model_name = served_model(get)
            folder = str(getattr(args, "tokenizer_path", "") or getattr(args, "model_path", ""))
            if folder and (Path(folder) / "tokenizer.json").is_file():
                self.tokenizer_dir = folder
            inc = incremental_output(get)
            if inc is not None:
                self.incremental = inc
            # Sending a priority to a server without priority scheduling may abort it.
            self.send_priority, threshold = priority_options(get)
        tm = self.engine.tokenizer_manager
        # The scheduler's start-up report (the first load snapshot can still be empty).
        info = _scheduler_info(self.engine)
        loads = await tm.get_loads()
        kv = int(find_key(info, "max_total_num_tokens") or 0) or sum(
            int(_field(x, "max_total_num_tokens")) for x in loads
        )
        running = sum(int(_field(x, "max_running_requests")) for x in loads) or int(
            getattr(args, "max_running_requests", 0) or 256
        )
        limits = (getattr(tm, "context_len", 0), find_key(info, "max_req_input_len"))
        vocab = getattr(getattr(tm, "tokenizer", None), "vocab_size", 0) or DEFAULT_VOCAB_SIZE
        if kv <= 0:
            raise EngineError("sglang.Engine reported no KV capacity")
        self._capacity = EngineCapacity(
            max_running_requests=running,
            max_total_tokens=kv,
            max_context_tokens=context_window(kv, *limits),
            vocab_size=int(vocab),
            preempt_threshold=threshold,
        )

    def capacity(self) -> EngineCapacity:
        if self._capacity is None:
            raise EngineError("sglang engine not started")
        return self._capacity

    async def load(self) -> EngineLoad:
        loads = await self.engine.tokenizer_manager.get_loads()
        return EngineLoad(
            running_requests=sum(int(_field(x, "num_running_reqs")) for x in loads),
            waiting_requests=sum(int(_field(x, "num_waiting_reqs")) for x in loads),
            used_kv_tokens=sum(int(_field(x, "num_used_tokens")) for x in loads),
        )

    async def abort(self, request_id: str) -> None:
        rid = self._live.get(request_id)
        if rid is not None:
            self.engine.tokenizer_manager.abort_request(rid=rid)

    async def generate(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        if not (req.prompt_text or req.prompt_token_ids):
            raise EngineError("refusing an empty prompt (it kills SGLang 0.5.23's scheduler)")
        # A fresh rid, never the client's id (see SglangHttpEngine.generate).
        rid = uuid.uuid4().hex
        kwargs = generate_args(req, rid, self.send_priority, "prompt")
        if req.trace_headers:
            kwargs["external_trace_header"] = dict(req.trace_headers)
        decoder = ChunkDecoder(req, incremental=self.incremental)
        try:
            gen = await self.engine.async_generate(**kwargs)
        except ValueError as exc:  # e.g. a duplicate rid, an over-long prompt
            raise EngineError(f"sglang rejected the request: {exc}") from exc
        self._live[req.request_id] = rid
        try:
            async with aclosing(gen) as stream:
                async for out in stream:
                    chunk = decoder.decode(out)
                    if chunk.text or chunk.token_ids or chunk.finish is not None:
                        yield chunk
                    if chunk.finish is not None:
                        return
            raise EngineError(
                "sglang ended the stream without a finish reason",
                retryable=decoder.completion_tokens == 0,
            )
        finally:
            self._live.pop(req.request_id, None)
            if not decoder.finished:
                # Cancelled or failed: free the request in the scheduler now.
                self.engine.tokenizer_manager.abort_request(rid=rid)

    async def aclose(self) -> None:
        engine, self.engine = self.engine, None
        if engine is None:
            return
        # SGLang's own tasks on our loop (its output loop, its SIGTERM watchdog) end here,
        # not as "destroyed but pending" when the loop closes.
        tm = getattr(engine, "tokenizer_manager", None)
        for task in list(getattr(tm, "asyncio_tasks", ())):
            task.cancel()
        if hasattr(engine, "shutdown"):
            # Kills and reaps the scheduler and detokenizer processes (blocking: a thread).
            await asyncio.to_thread(engine.shutdown)


def _own_signals(tm: Any) -> None:
    """Start SGLang's output loop now, and take back SIGTERM from it.

    The loop would otherwise start on the first request and put SGLang's SIGTERM
    handler on our event loop (drain SGLang's requests, kill the process tree,
    `sys.exit`) in place of fairgate's drain. Started here, before `serve` installs
    its own handlers, and SGLang's removed: SIGTERM is fairgate's. SIGQUIT stays
    SGLang's: a child process that dies takes the whole process down, as with its server.
    """
    start = getattr(tm, "auto_create_handle_loop", None)  # SGLang's; not every stand-in's
    if start is None:
        return
    start()
    if threading.current_thread() is threading.main_thread():
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
