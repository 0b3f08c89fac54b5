"""The OpenAI-compatible HTTP front: aiohttp in the server's own event loop.

`POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` (and an
open `GET /health`), on its own address (`FAIRGATE_HTTP_LISTEN`). Every request
goes the gRPC API's way: the same Authenticator (Bearer API keys, the tenant
header where auth allows it), the body converted to a GenerateRequest and
checked by service/validation.py, then service/generation.py (admission,
quotas, fairness, engine stream, settlement) and telemetry's per-request hooks.
Errors come from service/openai_errors.py.

A streamed response is started only when the first token (or the result) is
there, so a refusal in admission (429, 403, 503) gets a real HTTP status even
with `stream: true`. A client that disconnects cancels its handler
(`handler_cancellation`), which ends the generation the way a gRPC cancel
does: dequeued if queued, else the engine request aborted, the quota settled.

Shutdown is the gRPC port's (service/drain.py, applied in generation.py): once
`App.stop` begins the drain, new and queued requests get 503 + Retry-After,
`/health` answers 503 while the port keeps listening, streams in flight finish
or are cut (a final chunk with finish_reason "abort"); only then is the port closed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager

from aiohttp import web
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

from scheduler.errors import SchedulingError
from service import errors
from service.api_keys import KEY_PREFIX
from service.auth import Authenticator, Identity
from service.budget_check import BudgetCheck
from service.drain import CUT_WAIT_S, Drain
from service.engines.protocol import EngineError
from service.generation import Delta, Generation, Outcome
from service.http_site import HttpSite
from service.key_limiter import KeyLimiter
from service.lifecycle import ObserverFactory
from service.models import ModelRegistry
from service.openai_errors import http_error
from service.openai_request import PRIORITY_HEADER, param_name, to_generate_request
from service.openai_response import ResponseWriter, error_event
from service.ratelimit_headers import tenant_headers
from service.settings import Settings
from service.telemetry.observation import RpcScope
from service.telemetry.telemetry import Telemetry
from service.tls import server_ssl_context
from service.validation import validate_generate

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: Exception, extra: Sequence[tuple[str, str]] = ()) -> web.Response:
    """`exc` as OpenAI's JSON error; `extra`: more headers (the rate-limit ones)."""
    err = http_error(exc, param_name)
    return web.Response(
        status=err.status,
        body=err.json_bytes(),
        content_type="application/json",
        headers={**err.headers, **dict(extra)},
    )


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (unknown path, wrong method) in OpenAI's shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        body = {
            "error": {
                "message": f"{exc.reason}: {request.method} {request.path}",
                "type": "invalid_request_error" if exc.status < 500 else "server_error",
                "param": None,
                "code": exc.reason.lower().replace(" ", "_"),
            }
        }
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response(body, status=exc.status, headers=allow)


class OpenAIFront(HttpSite):
    def __init__(
        self,
        settings: Settings,
        models: ModelRegistry,
        auth: Authenticator,
        telemetry: Telemetry,
        drain: Drain,
        observers: Sequence[ObserverFactory] | None = None,
        keys: KeyLimiter | None = None,
        budgets: BudgetCheck | None = None,
    ) -> None:
        super().__init__(settings.http_listen)
        # API keys' own limits (service/key_limiter.py); None: not enforced.
        self.keys = keys
        self.settings = settings
        self.models = models
        self.auth = auth
        self.telemetry = telemetry
        self.drain = drain
        self.budgets = budgets
        self.observers = telemetry.observers if observers is None else tuple(observers)
        self._ssl = server_ssl_context(settings)

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(
            middlewares=[_json_errors],
            # Above the application limit, so an oversized body gets the same
            # 400 as an oversized gRPC request (not a bare 413).
            client_max_size=self.settings.max_receive_message_bytes,
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            # The drain (App.stop) has already waited out the grace and cut
            # the streams; this is only for handlers still sending their end.
            shutdown_timeout=CUT_WAIT_S,
        )
        # Workers of one node share the port (service/workers.py).
        await self._listen(runner, self._ssl, reuse_port=self.settings.workers > 1 or None)

    # -- routes ---------------------------------------------------------------------
    def _identity(self, request: web.Request) -> Identity:
        h = request.headers
        md = {k: v for k in ("authorization", self.auth.tenant_header) if (v := h.get(k))}
        token = md.get("authorization", "").partition(" ")[2].strip()
        if token and not token.startswith(KEY_PREFIX) and not self.auth.keys_required():
            # OpenAI SDKs must send some key ("EMPTY", "sk-…"): on a server that
            # requires none, a token that is not a fairgate key means "no key".
            del md["authorization"]
        return self.auth.tenant(md)

    async def _health(self, request: web.Request) -> web.Response:
        """For HTTP load balancers and probes (as SGLang and vLLM offer): 503 while draining."""
        return web.Response(status=503 if self.drain.draining else 200)

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._identity(request)
        except errors.ServiceError as exc:
            return error_response(exc)
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": 0,
                "owned_by": "fairgate",
                "max_model_len": m.max_context_tokens,
                # fairgate extension: token-id prompts must stay below it.
                "vocab_size": m.vocab_size,
            }
            for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        async with self._scope(request):
            return await self._serve(request, chat=chat)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        received_s = time.monotonic()
        try:
            identity = self._identity(request)
            tenant_id = identity.tenant_id
            key = self.keys.check(identity) if self.keys else None
            request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
            body = await self._body(request)
            converted = to_generate_request(
                body,
                chat=chat,
                request_id=request_id,
                priority_header=request.headers.get(PRIORITY_HEADER, ""),
            )
            params = validate_generate(
                converted.request, self.models, self.settings.max_request_bytes
            )
            generation = Generation(
                params,
                request_id=request_id,
                tenant_id=tenant_id,
                key_id=identity.key_id,
                budgets=self.budgets,
                received_s=received_s,
                deadline_s=None,
                max_tokens_set=converted.request.sampling.HasField("max_tokens"),
                prompt_field="messages" if chat else "prompt",
                observers=self.observers,
                drain=self.drain,
                key=key,
            )
        except (errors.ServiceError, SchedulingError) as exc:
            return error_response(exc)
        writer = ResponseWriter(
            chat=chat,
            request_id=request_id,
            model=params.model.name,
            include_usage=converted.include_usage,
        )
        headers = {"x-request-id": request_id}
        gate = params.model.dispatcher
        async with aclosing(generation.stream()) as events:
            try:
                first = await anext(events)
            except (errors.ServiceError, SchedulingError, EngineError) as exc:
                # ServiceError: ServerDraining (refused, failed in the queue, cut early).
                return error_response(exc, await tenant_headers(gate, tenant_id, key))
            # The tenant's buckets with this request charged (OpenAI's headers).
            headers.update(await tenant_headers(gate, tenant_id, key))
            if converted.stream:
                return await self._stream(request, writer, first, events, headers)
            return await self._complete(writer, first, events, headers)

    async def _body(self, request: web.Request) -> object:
        limit = self.settings.max_request_bytes
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raw = b""
            size = request.content_length or limit + 1
        else:
            size = len(raw)
        if size > limit:
            raise errors.InvalidRequest(
                [errors.FieldViolation("body", f"request is {size} bytes; the limit is {limit}")]
            )
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise errors.InvalidRequest(
                [errors.FieldViolation("body", f"not valid JSON: {exc}")]
            ) from None

    async def _complete(
        self,
        writer: ResponseWriter,
        first: Delta | Outcome,
        events: AsyncIterator[Delta | Outcome],
        headers: dict[str, str],
    ) -> web.Response:
        parts: list[str] = []
        event = first
        while isinstance(event, Delta):
            parts.append(event.text)
            event = await anext(events)
        if event.failure is not None:
            limits = [(k, v) for k, v in headers.items() if k.startswith("x-ratelimit-")]
            return error_response(event.failure, limits)
        return web.json_response(writer.complete("".join(parts), event), headers=headers)

    async def _stream(
        self,
        request: web.Request,
        writer: ResponseWriter,
        first: Delta | Outcome,
        events: AsyncIterator[Delta | Outcome],
        headers: dict[str, str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                **headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        opening = writer.first_chunk()
        if opening is not None:
            await response.write(opening)
        event = first
        try:
            while isinstance(event, Delta):
                await response.write(writer.text_chunk(event.text))
                event = await anext(events)
            if event.failure is not None:
                await response.write(error_event(http_error(event.failure, param_name).body()))
            else:
                await response.write(writer.final_chunks(event))
            await response.write_eof()
        except ConnectionResetError:
            # The client left; leaving `aclosing` ends the generation (settled, aborted).
            log.debug("client of %s disconnected", writer.id)
        return response

    @asynccontextmanager
    async def _scope(self, request: web.Request) -> AsyncIterator[None]:
        """The request's server span and telemetry scope, as the gRPC interceptor opens them."""
        tel = self.telemetry
        if not tel.enabled:
            yield
            return
        route = request.path
        span = tel.tracer.start_span(
            f"POST {route}",
            propagate.extract(request.headers),
            SpanKind.SERVER,
            {"http.request.method": "POST", "http.route": route, "url.scheme": "http"},
        )
        with RpcScope(tel, span, is_generate=True).current():
            yield
