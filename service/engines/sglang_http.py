"""SGLang over HTTP: the Engine Protocol on top of SGLang's native `/generate`.

Each request streams `POST /generate` (SSE) over this engine's own keep-alive
connections (`sse_client.py`: httptools, not aiohttp, on the per-token path)
with a fresh `rid` per attempt (never the client's request id, see
`generate`), our priority (when the server runs priority scheduling) and the
W3C trace headers. Cumulative or incremental
output is turned into deltas by `ChunkDecoder`. When the consumer closes the
stream early (client cancel, deadline), the request is aborted with
`POST /abort_request` and the connection dropped. Capacity comes from
`/server_info`, live load from `/v1/loads`: those calls, `/health` and the
aborts go through one `aiohttp.ClientSession`.

Failures: a connection that cannot be made, drops, stalls longer than the
read timeout, or carries malformed data becomes `EngineError` (`WorkerDown`
for transport failures, so a pool can eject the worker). Before the first
token such errors are retryable, and this adapter retries them itself
`retries` times; after it they are final.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from service.engines.protocol import (
    EngineCapacity,
    EngineChunk,
    EngineError,
    EngineLoad,
    EngineRequest,
)
from service.engines.read_watchdog import ReadTimeout, ReadWatchdog
from service.engines.sglang_chunks import (
    ChunkDecoder,
    RequestRefused,
    UpstreamError,
    find_key,
    generate_args,
    incremental_output,
    merge_chunks,
    priority_options,
    served_model,
)
from service.engines.sglang_server_info import capacity_from_server_info
from service.engines.sglang_sse import superseded
from service.engines.sse_client import SseConnection, StreamLost
from service.engines.sse_pool import SsePool
from service.engines.staged_prefill import StagedPrefill, StageLane, StagingStats, staged

log = logging.getLogger(__name__)


class WorkerDown(EngineError):
    """The worker could not be reached, dropped the stream, or went silent."""


@dataclass(frozen=True, slots=True)
class SglangHttpConfig:
    url: str
    connect_timeout_s: float = 5.0
    # Longest silence on a stream, including the wait for the first token.
    read_timeout_s: float = 60.0
    # Retries of a request that failed before its first token.
    retries: int = 1
    retry_backoff_s: float = 0.05
    # The server runs --incremental-streaming-output; /server_info overrides when it says.
    incremental_output: bool = False
    max_connections: int = 0  # 0: unlimited
    # SGLang's /health generates a token behind the running batch, after a 1 s sleep.
    health_timeout_s: float = 10.0
    # Send the events of one read as one chunk (else one chunk per SSE event).
    coalesce: bool = True
    # Coalescing: after sending a chunk, stop reading the stream this long so that the tokens
    # arriving meanwhile wait in the socket and go out as one message, read and parsed once
    # (0: send what each read brings). The first token is never held.
    coalesce_window_s: float = 0.0
    # Long prompts in prefix stages, prefill-only, on this worker (staged_prefill.py).
    staged_prefill: StagedPrefill = dataclasses.field(default_factory=StagedPrefill)


class SglangHttpEngine:
    kind = "sglang-http"

    def __init__(self, config: SglangHttpConfig) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        self.incremental = config.incremental_output
        self.send_priority = False
        self.served_model_name = ""
        self.server_info: dict[str, Any] = {}
        self._capacity: EngineCapacity | None = None
        self._session: aiohttp.ClientSession | None = None
        self._streams: SsePool | None = None
        self._abort_tasks: set[asyncio.Task[None]] = set()
        self._rids: dict[str, str] = {}  # request id -> SGLang rid of its live attempt
        self.in_flight = 0
        self.staging = StagingStats()
        self.stage_lane = StageLane()
        # The radix cache's granularity (SGLang's page_size), for staged prefill.
        self.page_tokens = 1

    # -- lifecycle ------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=self.config.connect_timeout_s,
                    sock_read=self.config.read_timeout_s,
                ),
            )
        return self._session

    @property
    def streams(self) -> SsePool:
        """The `/generate` streams' own keep-alive connections (sse_client.py)."""
        if self._streams is None:
            self._streams = SsePool(
                self.url, self.config.connect_timeout_s, self.config.max_connections
            )
        return self._streams

    async def start(self) -> None:
        await self.refresh_server_info()

    async def refresh_server_info(self) -> EngineCapacity:
        """Read /server_info (and /model_info) and update capacity and options."""
        info = await self._get_json("/server_info", fallback="/get_server_info")
        model_info: dict[str, Any] = {}
        try:
            model_info = await self._get_json("/model_info")
        except EngineError:
            log.debug("%s: no /model_info", self.url)
        self.server_info = info

        def get(key: str) -> Any:
            return find_key(info, key)

        incremental = incremental_output(get)
        if incremental is not None:
            self.incremental = incremental
        self.send_priority, threshold = priority_options(get)
        self.served_model_name = served_model(get)
        page = find_key(info, "page_size")
        self.page_tokens = page if isinstance(page, int) and page > 0 else 1
        cap = capacity_from_server_info(info, model_info)
        self._capacity = dataclasses.replace(cap, preempt_threshold=threshold)
        return self._capacity

    async def aclose(self) -> None:
        if self._abort_tasks:
            await asyncio.wait(list(self._abort_tasks), timeout=2.0)
        if self._streams is not None:
            await self._streams.aclose()
            self._streams = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- engine protocol ------------------------------------------------------
    def capacity(self) -> EngineCapacity:
        if self._capacity is None:
            raise EngineError(f"{self.url}: capacity unknown (engine not started)")
        return self._capacity

    async def load(self) -> EngineLoad:
        body = await self._get_json("/v1/loads")
        loads = body.get("loads")
        if not isinstance(loads, list):
            raise UpstreamError(f"{self.url}/v1/loads: no loads list")
        # LoadSnapshot omits zero fields, hence the defaults.
        return EngineLoad(
            running_requests=sum(int(x.get("num_running_reqs", 0)) for x in loads),
            waiting_requests=sum(int(x.get("num_waiting_reqs", 0)) for x in loads),
            used_kv_tokens=sum(int(x.get("num_used_tokens", 0)) for x in loads),
        )

    async def abort(self, request_id: str) -> None:
        rid = self._rids.get(request_id)
        if rid is not None:
            await self._abort_rid(rid)

    async def _abort_rid(self, rid: str) -> None:
        try:
            async with self.session.post(
                self.url + "/abort_request",
                json={"rid": rid, "abort_all": False},
                timeout=aiohttp.ClientTimeout(total=self.config.connect_timeout_s),
            ) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("%s: abort of %s failed: %s", self.url, rid, exc)

    async def health(self, timeout_s: float | None = None) -> bool:
        """GET /health. SGLang's runs a one-token generation and sleeps 1 s first."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.config.health_timeout_s)
        try:
            async with self.session.get(self.url + "/health", timeout=timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def generate(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        plan = self.config.staged_prefill
        if plan.laned(req):
            lane = self.stage_lane if plan.one_at_a_time else None
            return staged(self._generate_one, req, plan, self.staging, self.page_tokens, lane)
        return self._generate_one(req)

    async def _generate_one(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        if not (req.prompt_text or req.prompt_token_ids):
            # SGLang 0.5.23's scheduler dies on an empty prompt (the whole server exits).
            raise UpstreamError("refusing an empty prompt")
        attempt = 0
        try:
            while True:
                # A fresh rid per attempt, never the client's request id: SGLang
                # aborts by rid, a rid in use is refused, and a rid reused after its
                # request ended can be aborted late by that request's disconnect watch.
                rid = self._rids[req.request_id] = uuid.uuid4().hex
                decoder = ChunkDecoder(req, incremental=self.incremental)
                started = False
                try:
                    async for chunk in self._stream_once(req, decoder, rid):
                        started = started or bool(chunk.token_ids or chunk.text or chunk.finish)
                        yield chunk
                    return
                except EngineError as exc:
                    if started or not exc.retryable or attempt >= self.config.retries:
                        raise
                    attempt += 1
                    log.info("%s: retrying %s (%s)", self.url, req.request_id, exc)
                    await asyncio.sleep(self.config.retry_backoff_s * attempt)
        finally:
            self._rids.pop(req.request_id, None)

    async def _stream_once(
        self, req: EngineRequest, decoder: ChunkDecoder, rid: str
    ) -> AsyncGenerator[EngineChunk, None]:
        headers = {k: v for k, v in req.trace_headers.items() if k in ("traceparent", "tracestate")}
        headers["Content-Type"] = "application/json"
        conn: SseConnection | None = None
        watchdog: ReadWatchdog | None = None
        self.in_flight += 1
        try:
            try:
                # The silence before the headers counts against the read timeout too.
                async with asyncio.timeout(self.config.read_timeout_s):
                    conn = await self.streams.post(
                        "/generate",
                        orjson.dumps(generate_args(req, rid, self.send_priority, "text")),
                        headers,
                    )
            except TimeoutError as exc:
                silence = f"no data for {self.config.read_timeout_s:g} s"
                raise WorkerDown(f"{self.url}: {silence} (no headers)", retryable=True) from exc
            except ConnectionError as exc:
                raise WorkerDown(f"{self.url}: cannot reach SGLang: {exc}", retryable=True) from exc
            if conn.status != 200:
                try:
                    async with asyncio.timeout(self.config.read_timeout_s):
                        text = (await conn.body()).decode("utf-8", "replace")[:500]
                except TimeoutError:
                    text = "(its body did not come)"
                refused = 400 <= conn.status < 500 and conn.status != 429
                raise (RequestRefused if refused else UpstreamError)(
                    f"{self.url}/generate answered HTTP {conn.status}: {text}",
                    retryable=conn.status >= 500,
                )
            # The read timeout, watched without a timer per read (read_watchdog.py).
            watchdog = ReadWatchdog(conn, self.config.read_timeout_s)
            coalesce, window_s = self.config.coalesce, self.config.coalesce_window_s
            # Every event received so far at once: one chunk per batch when coalescing.
            while payloads := await conn.payloads():
                for group in [payloads] if coalesce else [[p] for p in payloads]:
                    chunk, ended, error = self._decode_batch(decoder, group)
                    if chunk is not None and (chunk.text or chunk.token_ids or chunk.finish):
                        yield chunk
                        if window_s > 0 and not ended:
                            # Let the next tokens gather (the first was not held).
                            await conn.hold(window_s)
                    if error is not None:
                        if decoder.completion_tokens:
                            error.retryable = False  # tokens reached the consumer
                        raise error
                    if ended:
                        return
            raise WorkerDown(
                f"{self.url}: stream ended without [DONE] after {decoder.completion_tokens} tokens",
                retryable=decoder.completion_tokens == 0,
            )
        except (StreamLost, ReadTimeout) as exc:
            what = f"no data for {self.config.read_timeout_s:g} s"
            if isinstance(exc, StreamLost):
                what = "connection lost"
            raise WorkerDown(
                f"{self.url}: {what} after {decoder.completion_tokens} tokens ({exc!r})",
                retryable=decoder.completion_tokens == 0,
            ) from exc
        finally:
            self.in_flight -= 1
            if watchdog is not None:
                watchdog.cancel()
            if conn is not None:
                if decoder.finished:
                    # The trailing [DONE] is read off in the background, then reused.
                    self.streams.release(conn)
                else:
                    # Cancelled, failed or abandoned: drop the connection and tell
                    # SGLang to free the request (it also aborts on disconnect).
                    self.streams.discard(conn)
                    self._abort_later(rid)

    def _decode_batch(
        self, decoder: ChunkDecoder, payloads: list[bytes]
    ) -> tuple[EngineChunk | None, bool, EngineError | None]:
        """One read's SSE payloads → one merged chunk, whether the stream ended,
        and the error that cut the batch short (after the chunk, which is sent)."""
        parsed: list[Any] = []
        error: EngineError | None = None
        for payload in payloads:
            if payload == b"[DONE]":
                if not decoder.finished:
                    error = UpstreamError(
                        f"{self.url}: stream ended without a finish reason",
                        retryable=decoder.completion_tokens == 0,
                    )
                break
            try:
                parsed.append(orjson.loads(payload))
            except orjson.JSONDecodeError as exc:
                error = UpstreamError(f"{self.url}: malformed JSON in stream: {exc}")
                break
        merged: EngineChunk | None = None
        last = len(parsed) - 1
        for i, data in enumerate(parsed):
            if i < last and not decoder.incremental and superseded(data):
                continue  # cumulative: the last chunk of the batch carries it all
            try:
                chunk = decoder.decode(data)
            except EngineError as exc:
                return merged, True, exc
            merged = chunk if merged is None else merge_chunks(merged, chunk)
            if chunk.finish is not None:
                return merged, True, None
        return merged, error is not None or len(parsed) < len(payloads), error

    def _abort_later(self, rid: str) -> None:
        if self._session is None or self._session.closed:
            return
        task = asyncio.get_running_loop().create_task(self._abort_rid(rid))
        self._abort_tasks.add(task)
        task.add_done_callback(self._abort_tasks.discard)

    async def _get_json(self, path: str, fallback: str | None = None) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s * 2)
        try:
            async with self.session.get(self.url + path, timeout=timeout) as resp:
                if resp.status == 404 and fallback is not None:
                    return await self._get_json(fallback)
                if resp.status != 200:
                    raise UpstreamError(f"{self.url}{path}: HTTP {resp.status}", retryable=True)
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise WorkerDown(f"{self.url}{path}: {exc!r}", retryable=True) from exc
        if not isinstance(body, dict):
            raise UpstreamError(f"{self.url}{path}: expected a JSON object")
        return body
