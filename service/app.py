"""The one place that wires everything: settings → scheduler → engine → server."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1._async import HealthServicer

from scheduler import rules
from scheduler.clock import MonotonicClock
from scheduler.errors import StoreUnavailable
from scheduler.key_gate import KeyGate
from scheduler.state.redis_key_state import RedisKeyState
from scheduler.tasks import stop_task
from service.admin_servicer import AdminServicer
from service.admission_setup import (
    admission_limits,
    follow_capacity,
    isolation_for,
    policy_options,
)
from service.api_keys import KeyHasher
from service.auth import Authenticator, AuthInterceptor
from service.budget_check import BudgetCheck
from service.chat_template import chat_template_for
from service.decode_guard import DecodeGuardInterceptor
from service.drain import CUT_WAIT_S, Drain
from service.engine_factory import build_engine
from service.engines.pool import WorkerPool
from service.engines.protocol import Engine
from service.grpc_server import BindError, add_services, bind, new_server, serving
from service.key_limiter import KeyLimiter
from service.models import ModelRegistry, ServedModel
from service.openai_http import OpenAIFront
from service.servicer import InferenceServicer
from service.settings import Settings
from service.shared_state import (
    build_dispatcher,
    build_key_state,
    build_prefix_share,
    build_tenant_store,
    build_usage_log,
    close_tenant_store,
)
from service.startup import EXIT_ENVIRONMENT, StartupError
from service.telemetry.setup import build_telemetry
from service.telemetry.telemetry import Telemetry
from service.tenant_directory import TenantDirectory
from service.tokenizer import load_tokenizer
from service.usage_log import UsageLog, observer_factory

# The virtual bench (clients/fairgate/bench) builds admission as the server does,
# importing these from here.
__all__ = ["App", "admission_limits", "isolation_for", "policy_options"]

log = logging.getLogger(__name__)


class App:
    """A running fairgate server. `await App.start(settings)`, then `await app.stop()`."""

    def __init__(
        self,
        settings: Settings,
        server: grpc.aio.Server,
        engine: Engine,
        models: ModelRegistry,
        health: HealthServicer,
        port: int,
        directory: TenantDirectory | None = None,
        telemetry: Telemetry | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.settings = settings
        self.server = server
        self.engine = engine
        self.models = models
        self.health = health
        self.port = port
        self.directory = directory
        self._tasks: list[asyncio.Task[None]] = []
        self.telemetry = telemetry or Telemetry.disabled()
        self.drain = drain or Drain()
        self._stopped = asyncio.Event()
        self._refresh: asyncio.Task[None] | None = None
        # The OpenAI-compatible HTTP front (settings.http_listen), when on.
        self.http: OpenAIFront | None = None
        self.usage: UsageLog | None = None
        self.keys: KeyLimiter | None = None
        # What App.start opened (engine, stores, share, usage log, telemetry…), closed
        # in reverse by `stop`: the one list, so nothing opened is left open.
        self._opened = contextlib.AsyncExitStack()

    @property
    def address(self) -> str:
        host = self.settings.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @classmethod
    async def start(cls, settings: Settings, telemetry: Telemetry | None = None) -> App:
        """`telemetry`: defaults to what the OTEL_* environment configures. A failure
        half-way (StartupError) closes what was started, so nothing is left to the loop."""
        async with contextlib.AsyncExitStack() as undo:
            try:
                app = await cls._start(settings, telemetry, undo)
                app._opened = undo.pop_all()  # started: App.stop closes it all from now on
            except StoreUnavailable as exc:
                raise StartupError(
                    "redis_url",
                    f"store=redis but Redis at {settings.redis_url} is unreachable ({exc}): "
                    "start it, or point the setting at it",
                    EXIT_ENVIRONMENT,
                ) from None
        return app

    @classmethod
    async def _start(
        cls, settings: Settings, telemetry: Telemetry | None, undo: contextlib.AsyncExitStack
    ) -> App:
        telemetry = telemetry or build_telemetry(settings)
        undo.push_async_callback(telemetry.aclose)  # closed last
        engine, model_name = build_engine(settings)
        await engine.start()
        undo.push_async_callback(engine.aclose)
        # SGLang engines learn the served model's name when they start.
        model_name = model_name or getattr(engine, "served_model_name", "") or "default"
        cap = engine.capacity()
        clock = MonotonicClock()
        # Tenants and key hashes live in the tenant store (in memory, or in Redis
        # with store=redis: shared by every replica); a tenants file seeds a new store.
        store = build_tenant_store(settings)
        undo.push_async_callback(close_tenant_store, store)
        directory = TenantDirectory(
            store,
            KeyHasher.from_setting(settings.api_key_pepper),
            fallback_default=settings.default_tenant,
        )
        if settings.tenants_file:
            await directory.seed_from_file(settings.tenants_file)
        await directory.refresh()
        tenants = directory.registry
        options = policy_options(settings, clock, tenants, directory.weight_of)
        isolation = isolation_for(settings, cap)
        pool = engine if isinstance(engine, WorkerPool) else None
        placement = None if pool is None else pool.placement
        if placement is not None and placement.routing != "locality":
            placement = None
        lends_unsent = settings.fair_light_takes_unsent_slots
        lends_unsent = lends_unsent and isolation is rules.Isolation.RESERVE_SLOTS
        dispatcher = await build_dispatcher(
            settings,
            options,
            admission_limits(cap, settings),
            clock,
            tenants,
            model_name,
            isolation,
            None if placement is None else placement.cached_prefix,
            pool.unsent if pool is not None and lends_unsent else None,
        )
        undo.push_async_callback(dispatcher.aclose)
        if placement is not None and settings.store == "redis":
            share = build_prefix_share(settings, model_name, placement)
            await share.start()
            undo.push_async_callback(share.aclose)
        # The in-process engine knows its model's folder: its tokenizer unless one is set.
        tokenizer_path = settings.tokenizer_path or getattr(engine, "tokenizer_dir", "")
        tokenizer = load_tokenizer(tokenizer_path or None, cap.vocab_size)
        model = ServedModel(
            name=model_name,
            engine=engine,
            tokenizer=tokenizer,
            dispatcher=dispatcher,
            max_context_tokens=cap.max_context_tokens,
            max_output_tokens=min(settings.max_output_tokens, cap.max_context_tokens - 1),
            default_max_tokens=settings.default_max_tokens,
            # The model's tokenizer knows the vocabulary; SGLang's HTTP API does not
            # say it, and one token id past the embedding table kills its scheduler.
            vocab_size=tokenizer.vocab_size if tokenizer.exact else cap.vocab_size,
            # The simulated model's format is the default template: no warning for it.
            chat_template=chat_template_for(
                model_name,
                settings.chat_template_path,
                tokenizer_path,
                warn=engine.kind != "simulator",
            ),
            preempt_threshold=cap.preempt_threshold,
            isolation=isolation,
            prefix_keys=None if placement is None else placement.prefix_keys,
        )
        models = ModelRegistry([model], default=model_name)
        telemetry.watch_model(model)
        telemetry.watch_tenants(lambda: directory.registry)
        directory.attach([dispatcher])
        auth = Authenticator(
            directory,
            mode=settings.auth_mode,
            admin_token=settings.admin_token,
            tenant_header=settings.tenant_header,
        )
        # The telemetry span wraps authentication, so refusals are traced too.
        # Undecodable requests: INVALID_ARGUMENT, after authentication.
        server = new_server(
            settings, [*telemetry.interceptors(), AuthInterceptor(auth), DecodeGuardInterceptor()]
        )
        key_state = build_key_state(settings, clock)
        undo.push_async_callback(key_state.aclose)
        keys = KeyLimiter(
            KeyGate(key_state, fail_open=settings.redis_failure_mode != "closed"), directory
        )
        drain = Drain()
        usage = build_usage_log(settings)
        undo.push_async_callback(usage.aclose)
        observers = (*telemetry.observers, observer_factory(usage))
        # Budgets read the usage log's counters before a request is queued.
        budgets = BudgetCheck(usage, fail_closed=settings.redis_failure_mode == "closed")
        telemetry.watch_budgets(budgets)
        health = add_services(
            server,
            InferenceServicer(settings, models, telemetry, drain, observers, keys, budgets),
            AdminServicer(directory, models, settings.policy, usage),
        )
        undo.push_async_callback(server.stop, 0)
        port = bind(server, settings)
        try:
            await telemetry.start()
        except OSError as exc:  # the metrics port (a worker's: its base + its index)
            raise BindError(
                "metrics_listen",
                f"cannot listen on the metrics port: {exc.strerror}",
                EXIT_ENVIRONMENT,
            ) from None
        await server.start()
        await serving(health)
        app = cls(settings, server, engine, models, health, port, directory, telemetry, drain)
        app.usage = usage
        app.keys = keys
        if settings.http_listen:
            app.http = OpenAIFront(
                settings, models, auth, telemetry, drain, observers, keys, budgets
            )
            undo.push_async_callback(app.http.stop)
            try:
                await app.http.start()
            except OSError as exc:  # checked before (service.main.check_ports): a race
                raise BindError(
                    "http_listen",
                    f"cannot listen on {settings.http_listen}: {exc.strerror}",
                    EXIT_ENVIRONMENT,
                ) from None
        if settings.tenant_sync_interval_s > 0:
            app._tasks.append(
                asyncio.create_task(
                    directory.run(settings.tenant_sync_interval_s), name="tenant-sync"
                )
            )
        if isinstance(key_state, RedisKeyState):
            # Open requests' leases outlive a renewal by two intervals.
            renew_s = settings.redis_lease_ttl_s / 3
            app._tasks.append(asyncio.create_task(key_state.run(renew_s), name="key-leases"))
        if settings.capacity_refresh_s > 0:
            app._refresh = asyncio.create_task(
                follow_capacity(engine, dispatcher, settings), name="capacity-refresh"
            )
        log.info(
            "fairgate serving %s on %s%s (engine=%s, policy=%s, store=%s, tls=%s, auth=%s)",
            model_name,
            app.address,
            f" and {app.http.url}" if app.http is not None else "",
            engine.kind,
            settings.policy,
            settings.store,
            "mutual" if settings.tls_client_ca_file else bool(settings.tls_cert_file),
            settings.auth_mode,
        )
        return app

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, stop taking RPCs, drain, close the engine."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        # Both fronts drain at once, still listening: probes, also on new
        # connections, read NOT_SERVING (HTTP /health: 503); queued and new
        # requests get UNAVAILABLE + RetryInfo (HTTP 503 + Retry-After) at once.
        await self.health.enter_graceful_shutdown()
        failed = self.drain.begin()
        log.info(
            "draining: %d streams in flight, %d queued requests refused; grace %gs",
            self.drain.streams,
            failed,
            grace,
        )
        if not await self.drain.wait_idle(grace):
            # Cut streams end with a final result (FINISH_REASON_CANCELLED).
            await self.drain.cut(wait_s=CUT_WAIT_S)
        # Whatever is left (an engine that ignored the abort) is cancelled here.
        if self.http is not None:
            await asyncio.gather(self.server.stop(CUT_WAIT_S), self.http.stop())
        else:
            await self.server.stop(CUT_WAIT_S)
        await stop_task(self._refresh)
        for task in self._tasks:
            await stop_task(task)
        # In reverse of opening: the usage log's last records and the key gate's
        # last refunds, the prefix share, the dispatcher's last settlements, then
        # the stores, the engine and telemetry.
        await self._opened.aclose()
        log.info("fairgate stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
