"""The simulated engine as a standalone server speaking SGLang's native HTTP API.

A GPU-free stand-in for `python -m sglang.launch_server`: `POST /generate`
(SSE streaming with cumulative or incremental text, or one JSON answer),
`POST /abort_request`, `GET /server_info` (and `/get_server_info`),
`GET /v1/loads`, `/health`, `/health_generate`, `/model_info`, `/v1/models`,
`/flush_cache` (the prefix cache, kept per engine as SGLang's radix cache).
Field names follow SGLang 0.5 (see the team's sglang-notes). It records the
`traceparent` headers and aborts it receives, and has fault switches
(`Faults`) so tests can make it stall, truncate or garble a stream, or die.

Run it with `fairgate sim-server` or `python -m service.engines.simulator.http_server`
(the process entry, with its flags).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from service.engines.protocol import EngineError, EngineRequest
from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.sglang_info import VERSION, loads_body
from service.engines.simulator.sglang_wire import (
    INPUT_MARGIN_TOKENS,
    InvalidRequest,
    abort_reason,
    error_object,
    finish_meta,
    finish_reason,
    json_error,
    meta_info,
    parse_generate,
    sent_now,
    sse_data,
)
from service.http_site import HttpSite
from service.tokenizer import ApproxTokenizer

DONE = b"data: [DONE]\n\n"
FLUSHED = (
    b"Cache flushed.\nPlease check backend logs for more details. "
    b"(When there are running or waiting requests, the operation will not be performed.)\n"
)


@dataclass(slots=True)
class Faults:
    """Test switches; counts are SSE chunks of one stream."""

    stall_after_chunks: int | None = None  # stop sending, keep the connection open
    truncate_after_chunks: int | None = None  # end the response without [DONE]
    garble_after_chunks: int | None = None  # send a line of broken JSON
    drop_meta_info: bool = False  # chunks without meta_info
    first_chunk_delay_s: float = 0.0  # hold the first chunk back
    unhealthy: bool = False  # /health answers 503


@dataclass(slots=True)
class Record:
    """What the stand-in saw, for tests."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    traceparents: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)  # via /abort_request
    disconnected: list[str] = field(default_factory=list)  # client went away mid-stream


class SimServer(HttpSite):
    def __init__(
        self,
        engine: SimulatedEngine,
        *,
        model_name: str = "",
        incremental_output: bool = False,
        enable_priority_scheduling: bool = False,
    ) -> None:
        self.engine = engine
        self.model_name = model_name or engine.config.cost.model.name
        self.incremental_output = incremental_output
        self.enable_priority_scheduling = enable_priority_scheduling
        self.tokenizer = ApproxTokenizer(vocab_size=engine.config.vocab_size)
        self.faults = Faults()
        self.record = Record()
        self._live: dict[str, web.Request] = {}
        super().__init__("127.0.0.1:0")
        app = web.Application(client_max_size=64 << 20, middlewares=[_json_not_found])
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health_generate)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/flush_cache", self._flush_cache)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        await self.engine.start()
        # Handlers are cancelled when the client disconnects, as in SGLang
        # (which aborts the request then): our finally blocks abort the rid.
        self.host, self.port = host, port
        await self._listen(web.AppRunner(self.app, handler_cancellation=True, access_log=None))
        return self.port

    async def stop(self) -> None:
        await super().stop()
        await self.engine.aclose()

    async def kill(self) -> None:
        """Die like a crashed worker: drop every connection, stop listening."""
        for req in list(self._live.values()):
            if req.transport is not None:
                req.transport.abort()
        self._live.clear()
        await self.stop()

    # -- /generate ------------------------------------------------------------
    async def _generate(self, request: web.Request) -> web.StreamResponse:
        trace = request.headers.get("traceparent")
        if trace:
            self.record.traceparents.append(trace)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _json(json_error(f"JSON decode error: {exc}"), status=400)
        self.record.requests.append(body if isinstance(body, dict) else {"body": body})
        stream = isinstance(body, dict) and bool(body.get("stream"))
        try:
            req, stream = parse_generate(body, self.tokenizer, self.engine.core.max_context)
            if req.request_id in self._live:
                raise InvalidRequest(f"Duplicate request ID: {req.request_id}")
        except InvalidRequest as exc:
            if not stream:
                return _json({"error": {"message": str(exc)}}, status=400)
            resp = await _sse(request)
            if exc.by_scheduler:  # the scheduler refuses it: an abort chunk with 400
                rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
                meta = meta_info(rid, 0)
                meta["finish_reason"] = abort_reason(str(exc), 400, "BadRequestError")
                finish_meta(meta, time.monotonic())
                sent_now(meta)
                await resp.write(sse_data({"text": "", "output_ids": [], "meta_info": meta}))
            else:
                await resp.write(sse_data({"error": error_object(400, str(exc))}))
            await resp.write(DONE)
            await resp.write_eof()
            return resp
        if not stream:
            last: dict[str, Any] = {}
            async for out in self.chunks(req, incremental=False):
                last = out
            sent_now(last["meta_info"])
            status = (last["meta_info"]["finish_reason"] or {}).get("status_code")
            return _json(last, status=503 if status == 503 else 200)
        return await self._stream(request, req)

    async def _stream(self, request: web.Request, req: EngineRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        self._live[req.request_id] = request
        f = self.faults
        sent = 0
        try:
            await resp.prepare(request)
            async with aclosing(self.chunks(req, incremental=self.incremental_output)) as chunks:
                async for out in chunks:
                    if sent == 0 and f.first_chunk_delay_s:
                        await asyncio.sleep(f.first_chunk_delay_s)
                    if f.stall_after_chunks is not None and sent >= f.stall_after_chunks:
                        await asyncio.Event().wait()  # until the client goes away
                    if f.truncate_after_chunks is not None and sent >= f.truncate_after_chunks:
                        await resp.write_eof()  # a clean end, but no finish and no [DONE]
                        return resp
                    if f.garble_after_chunks is not None and sent >= f.garble_after_chunks:
                        await resp.write(b'data: {"text": "oops", "meta_in\n\n')
                        continue
                    if f.drop_meta_info:
                        out.pop("meta_info")
                    elif sent == 0:
                        sent_now(out["meta_info"])
                    await resp.write(sse_data(out))
                    sent += 1
            await resp.write(DONE)
            await resp.write_eof()
        except asyncio.CancelledError:
            self.record.disconnected.append(req.request_id)
            raise
        except ConnectionResetError:
            # The client went away (before the headers, or mid-stream): SGLang
            # aborts the request and logs no error; aiohttp drops the response.
            self.record.disconnected.append(req.request_id)
        finally:
            self._live.pop(req.request_id, None)
        return resp

    async def chunks(
        self, req: EngineRequest, *, incremental: bool
    ) -> AsyncGenerator[dict[str, Any], None]:
        """SGLang chunk dicts for one request (also used by in-process fakes)."""
        started_s = time.monotonic()
        text, ids = "", []
        meta = meta_info(req.request_id, req.prompt_tokens)
        # max_new_tokens 0 is prefill only, as SGLang: the engine prefills the prompt
        # (into its prefix cache) and ends with no output.
        try:
            async with aclosing(self.engine.generate(req)) as stream:
                async for ch in stream:
                    text += ch.text
                    ids.extend(ch.token_ids)
                    meta["completion_tokens"] = ch.completion_tokens
                    meta["prompt_tokens"] = ch.prompt_tokens
                    meta["cached_tokens"] = ch.cached_tokens
                    meta["num_retractions"] = ch.retractions
                    if ch.finish is not None:
                        meta["finish_reason"] = finish_reason(ch.finish, ch.stop_matched, req)
                        finish_meta(meta, started_s)
                    yield {
                        "text": ch.text if incremental else text,
                        "output_ids": list(ch.token_ids) if incremental else list(ids),
                        "meta_info": dict(meta),
                    }
                    if ch.finish is not None:
                        return
        except EngineError as exc:
            # The engine's waiting queue is full (--max-queued-requests): SGLang
            # answers with an abort chunk carrying 503.
            meta["finish_reason"] = abort_reason(str(exc), 503)
            finish_meta(meta, started_s)
            yield {"text": "", "output_ids": [], "meta_info": meta}

    # -- control and introspection -------------------------------------------
    async def _abort(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _json(json_error(f"JSON decode error: {exc}"), status=400)
        rids = list(self._live) if body.get("abort_all") else [body.get("rid", "")]
        for rid in rids:
            if rid:
                self.record.aborted.append(rid)
                await self.engine.abort(rid)
        return web.Response(status=200)

    async def _flush_cache(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "POST"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        if not self.engine.core.flush_cache():
            return web.Response(status=400, body=b"Flush cache failed.\n")
        return web.Response(status=200, body=FLUSHED)

    def server_info(self) -> dict[str, Any]:
        cfg, core = self.engine.config, self.engine.core
        model = cfg.cost.model
        return {
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "tokenizer_path": self.model_name,
            # Unset unless --context-length is given; the model's window is in /v1/models.
            "context_length": None,
            "max_running_requests": cfg.max_running_requests,
            "max_queued_requests": cfg.max_queued_requests,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "schedule_policy": "fcfs",
            "enable_priority_scheduling": self.enable_priority_scheduling,
            "disable_priority_preemption": cfg.priority_preemption_threshold is None,
            "schedule_low_priority_values_first": False,
            "priority_scheduling_preemption_threshold": (
                cfg.priority_preemption_threshold
                if cfg.priority_preemption_threshold is not None
                else SGLANG_PREEMPTION_THRESHOLD
            ),
            "incremental_streaming_output": self.incremental_output,
            "enable_metrics": False,
            "enable_trace": False,
            "dp_size": 1,
            "tp_size": 1,
            "max_total_num_tokens": core.capacity,
            "max_req_input_len": core.max_context - INPUT_MARGIN_TOKENS,
            "status": "ready",
            "internal_states": [
                {
                    "effective_max_running_requests_per_dp": cfg.max_running_requests,
                    "memory_usage": {
                        "weight": model.weight_bytes / 1e9,
                        "kvcache": core.capacity * model.kv_bytes_per_token / 1e9,
                        "token_capacity": core.capacity,
                    },
                    "last_gen_throughput": 0.0,
                }
            ],
            "version": VERSION,
        }

    async def _server_info(self, request: web.Request) -> web.Response:
        return _json(self.server_info())

    async def _loads(self, request: web.Request) -> web.Response:
        return _json(loads_body(self.engine))

    async def _health(self, request: web.Request) -> web.Response:
        # SGLang's /health generates one token after a 1 s sleep unless
        # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false; the stand-in's is that cheap one.
        return web.Response(status=503 if self.faults.unhealthy else 200)

    async def _health_generate(self, request: web.Request) -> web.Response:
        if self.faults.unhealthy:
            return web.Response(status=503)
        req = EngineRequest(f"health-{uuid.uuid4().hex}", [1, 2, 3], max_tokens=1)
        async for _ in self.chunks(req, incremental=True):
            pass
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "tokenizer_path": self.model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.model_name,
                        "parent": None,
                        "max_model_len": self.engine.core.max_context,
                    }
                ],
            }
        )


def _json(body: Any, status: int = 200) -> web.Response:
    # SGLang (FastAPI) sends a bare `application/json`, no charset parameter.
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )


@web.middleware
async def _json_not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown paths answer as FastAPI does: 404 with a JSON detail."""
    try:
        resp: web.StreamResponse = await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    return resp


SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    return resp
