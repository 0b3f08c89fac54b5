"""The one place that wires everything: settings → scheduler → engine → server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc
from fairgate.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.clock import Clock, MonotonicClock
from scheduler.errors import StoreUnavailable
from scheduler.gate import AdmissionGate
from scheduler.key_gate import KeyGate
from scheduler.ordering.policies import PolicyOptions
from scheduler.state.redis_key_state import RedisKeyState
from scheduler.tasks import stop_task
from scheduler.tenancy.tenant_file import load_tenants
from scheduler.tenancy.tenants import TenantRegistry
from service.admin_servicer import AdminServicer
from service.api_keys import KeyHasher
from service.auth import Authenticator, AuthInterceptor
from service.budget_check import BudgetCheck
from service.chat_template import chat_template_for
from service.decode_guard import DecodeGuardInterceptor
from service.drain import CUT_WAIT_S, Drain
from service.engine_factory import build_engine
from service.engines.pool import WorkerPool
from service.engines.protocol import Engine, EngineCapacity
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
from service.tls import server_credentials
from service.tokenizer import load_tokenizer
from service.usage_log import UsageLog, observer_factory

log = logging.getLogger(__name__)

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


class BindError(StartupError):
    """A port could not be bound (taken, or a bad address)."""


def admission_limits(cap: EngineCapacity, settings: Settings) -> AdmissionLimits:
    return AdmissionLimits(
        max_requests=max(1, int(cap.max_running_requests * settings.running_target_fraction)),
        max_kv_tokens=max(1, int(cap.max_total_tokens * settings.kv_target_fraction)),
    )


def policy_options(
    settings: Settings,
    clock: Clock,
    tenants: TenantRegistry,
    weight_of: Callable[[str], float] | None = None,
) -> PolicyOptions:
    """The queue policy's options from the settings."""
    return PolicyOptions(
        clock=clock,
        tenants=tenants,
        weight_of=weight_of,
        vtc_w_in=settings.vtc_w_in,
        vtc_w_out=settings.vtc_w_out,
        vtc_w_cached=settings.vtc_w_cached,
        light_credit=settings.fair_light_credit,
        rate_limit_per_s=settings.rate_limit_per_s,
        rate_limit_burst=settings.rate_limit_burst or None,
    )


def isolation_for(setting: str, cap: EngineCapacity) -> rules.Isolation:
    """Settings' fair_isolation against what the engine can do."""
    if setting == "reserve":
        return rules.Isolation.RESERVE
    if cap.preempt_threshold is None:
        if setting == "preempt":
            raise ValueError(
                "fair_isolation=preempt needs an engine that preempts by priority (SGLang "
                "with --enable-priority-scheduling and without --disable-priority-preemption)"
            )
        return rules.Isolation.RESERVE
    return rules.Isolation.PREEMPT


def load_tenant_registry(settings: Settings) -> TenantRegistry:
    if settings.tenants_file:
        return load_tenants(settings.tenants_file)
    return TenantRegistry.permissive(settings.default_tenant)


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
        isolation = isolation_for(settings.fair_isolation, cap)
        placement = engine.placement if isinstance(engine, WorkerPool) else None
        if placement is not None and placement.routing != "locality":
            placement = None
        dispatcher = await build_dispatcher(
            settings,
            options,
            admission_limits(cap, settings),
            clock,
            tenants,
            model_name,
            isolation,
            None if placement is None else placement.cached_prefix,
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
        server = grpc.aio.server(
            options=_server_options(settings),
            # The telemetry span wraps authentication, so refusals are traced too.
            # Undecodable requests: INVALID_ARGUMENT, after authentication.
            interceptors=[
                *telemetry.interceptors(),
                AuthInterceptor(auth),
                DecodeGuardInterceptor(),
            ],
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
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            InferenceServicer(settings, models, telemetry, drain, observers, keys, budgets),
            server,
        )
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(directory, models, settings.policy, usage), server
        )
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                ADMIN_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        undo.push_async_callback(server.stop, 0)
        creds = server_credentials(settings)
        try:
            if creds is None:
                port = server.add_insecure_port(settings.listen)
            else:
                port = server.add_secure_port(settings.listen, creds)
        except RuntimeError:  # grpc's "Failed to bind to address …" (checked before: a race)
            port = 0
        if port == 0:
            raise BindError("listen", f"cannot listen on {settings.listen}", EXIT_ENVIRONMENT)
        try:
            await telemetry.start()
        except OSError as exc:  # the metrics port (a worker's: its base + its index)
            raise BindError(
                "metrics_listen",
                f"cannot listen on the metrics port: {exc.strerror}",
                EXIT_ENVIRONMENT,
            ) from None
        await server.start()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
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
                _follow_capacity(engine, dispatcher, settings), name="capacity-refresh"
            )
        log.info(
            "fairgate serving %s on %s%s (engine=%s, policy=%s, store=%s, tls=%s, auth=%s)",
            model_name,
            app.address,
            f" and {app.http.url}" if app.http is not None else "",
            engine.kind,
            settings.policy,
            settings.store,
            "mutual" if settings.tls_client_ca_file else bool(creds),
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


async def _follow_capacity(engine: Engine, dispatcher: AdmissionGate, settings: Settings) -> None:
    """Keep the admission limits in step with the engine's capacity (pools shrink and grow)."""
    while True:
        await asyncio.sleep(settings.capacity_refresh_s)
        limits = admission_limits(engine.capacity(), settings)
        if limits != dispatcher.budget.limits:
            log.info("admission limits now %s", limits)
            dispatcher.set_limits(limits)


def _server_options(s: Settings) -> list[tuple[str, int]]:
    opts = [
        ("grpc.max_receive_message_length", s.max_receive_message_bytes),
        ("grpc.max_send_message_length", s.max_send_message_bytes),
        ("grpc.keepalive_time_ms", int(s.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # Explicit, since gRPC turns SO_REUSEPORT on by default (Linux): workers of
        # one node share the port (service/workers.py); a lone server fails to bind
        # a port already taken rather than silently splitting its traffic.
        ("grpc.so_reuseport", 1 if s.workers > 1 else 0),
    ]
    if s.max_concurrent_streams:
        opts.append(("grpc.max_concurrent_streams", s.max_concurrent_streams))
    return opts
