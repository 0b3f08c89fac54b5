"""`fairgate bench load --protocol http`: the same load over the OpenAI-compatible API.

Each request is a streamed `POST /v1/completions` with the token-id prompt,
`max_tokens`, `ignore_eos` and `stream_options.include_usage` (the usage
chunk gives the exact output count), so a run measures the same requests
as the gRPC load, only through the HTTP front. Errors map back to the gRPC
code names the report counts (429 → RESOURCE_EXHAUSTED, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import aiohttp

from fairgate.bench.stats import REJECT_CODES, RequestRecord
from fairgate.bench.workload import Tenant

# HTTP status → the gRPC code the OpenAI front derived it from (service/openai_errors.py).
_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def base_url(address: str) -> str:
    """`host:port` or a URL → the API root (`…/v1`)."""
    url = address if address.startswith(("http://", "https://")) else f"http://{address}"
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class HttpLoad:
    """One aiohttp session (connection pool) for the whole run."""

    def __init__(
        self, address: str, tenants: Sequence[Tenant], model: str, timeout_s: float | None
    ) -> None:
        self.url = base_url(address)
        self.model = model
        self._headers = {t.name: dict(t.metadata()) for t in tenants}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> int | None:
        """Open the session; learn the model (and its vocabulary size, when told)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=self._timeout
        )
        first = next(iter(self._headers.values()))
        async with self._session.get(f"{self.url}/models", headers=first) as r:
            r.raise_for_status()
            models = (await r.json())["data"]
        chosen = next((m for m in models if m["id"] == self.model), None) if self.model else None
        chosen = chosen or models[0]
        self.model = chosen["id"]
        vocab = chosen.get("vocab_size")
        return int(vocab) if isinstance(vocab, int) else None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def one(
        self,
        record: RequestRecord,
        prompt: list[int],
        time_scale: float,
        on_tokens: Callable[[int], None],
    ) -> None:
        """Run `record`'s request and fill in its timings and outcome."""
        assert self._session is not None, "start() first"
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": record.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        k = 1.0 / time_scale
        start = time.perf_counter()
        last: float | None = None
        try:
            async with self._session.post(
                f"{self.url}/completions", json=body, headers=self._headers[record.tenant]
            ) as r:
                if r.status != 200:
                    code = _CODES.get(r.status, f"HTTP_{r.status}")
                    try:
                        reason = str((await r.json())["error"]["code"]).upper()
                    except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                        reason = ""
                    record.error = f"{code}/{reason}" if reason else code
                    shed = code == "UNAVAILABLE" and "Retry-After" in r.headers
                    record.outcome = "rejected" if code in REJECT_CODES or shed else "failed"
                    return
                async for line in r.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    now = time.perf_counter()
                    event = json.loads(line[6:])
                    if "error" in event:
                        record.outcome, record.error = "failed", "STREAM_ERROR"
                        return
                    choices = event["choices"]
                    if choices and choices[0]["text"]:
                        if last is None:
                            record.ttft_s = (now - start) * k
                        else:
                            record.itl_s.append((now - last) * k)
                        last = now
                    if choices and choices[0]["finish_reason"] is not None:
                        record.finish_reason = choices[0]["finish_reason"]
                        record.e2e_s = (now - start) * k
                    if event.get("usage"):
                        record.output_tokens = event["usage"]["completion_tokens"]
        except (aiohttp.ClientError, TimeoutError) as exc:
            record.outcome = "failed"
            record.error = type(exc).__name__
            return
        if record.finish_reason in ("length", "stop"):
            record.outcome = "ok"
        else:
            record.outcome = "failed"
            record.error = f"FINISH_{(record.finish_reason or 'none').upper()}"
        if record.output_tokens:
            on_tokens(record.output_tokens)
