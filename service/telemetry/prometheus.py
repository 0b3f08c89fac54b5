"""The Prometheus scrape endpoint: `GET /metrics` on its own port, served in the server's loop."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.http_site import HttpSite


class MetricsEndpoint(HttpSite):
    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        super().__init__(listen)
        self.registry = registry

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        await self._listen(web.AppRunner(app, access_log=None))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"
