"""An aiohttp application listening on one host:port, served in the server's loop.

The OpenAI-compatible front (service/openai_http.py), the Prometheus scrape
endpoint (service/telemetry/prometheus.py) and the simulator's SGLang-style
server (service/engines/simulator/sim_server.py) listen this way: the address parsed
from a `host:port` setting (port 0 picks a free one, reported once bound), and
a stop that also cleans up after a refused port.
"""

from __future__ import annotations

import ssl

from aiohttp import web


class HttpSite:
    def __init__(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]") or "0.0.0.0"
        self.port = int(port)
        self._runner: web.AppRunner | None = None

    async def _listen(
        self,
        runner: web.AppRunner,
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool | None = None,
    ) -> None:
        await runner.setup()
        self._runner = runner  # stop() cleans it up, also when the port is refused
        site = web.TCPSite(
            runner, self.host, self.port, ssl_context=ssl_context, reuse_port=reuse_port
        )
        await site.start()
        self.port = runner.addresses[0][1]  # the bound port when 0 was asked for

    async def stop(self) -> None:
        """Close the port (the OpenAI front: after `App.stop` has drained, service/drain.py)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
