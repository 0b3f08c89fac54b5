"""The gRPC quota tests again, with the state in Redis (one replica, a real server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import App
from service.settings import Settings
from tests.conftest import StartServer
from tests.integration.test_quotas_grpc import (  # noqa: F401  (re-run here)
    quota_server,
    test_default_max_tokens_respects_the_tenant_cap,
    test_default_tenant_applies_without_a_header,
    test_no_tenant_and_no_default_is_refused,
    test_queue_cap_and_queue_timeout,
    test_refused_tenants_get_permission_denied,
    test_request_rate_rejection_carries_retry_info_and_quota_failure,
    test_tenant_caps_are_invalid_argument,
    test_token_bucket_limits_reserved_tokens,
    test_wait_mode_queues_until_the_bucket_refills,
)


@pytest.fixture
async def start_server(redis_url: str) -> AsyncIterator[StartServer]:
    apps: list[App] = []

    async def _start(**overrides: Any) -> App:
        base = Settings(
            listen="127.0.0.1:0",
            http_listen="",
            sim_time_scale=0.0,
            shutdown_grace_s=1.0,
            store="redis",
            redis_url=redis_url,
        )
        app = await App.start(base.replace(**overrides))
        apps.append(app)
        return app

    yield _start
    for app in apps:
        await app.stop(grace_s=0.5)
