from __future__ import annotations

import math

import pytest

from scheduler.clock import FakeClock
from scheduler.errors import QuotaExceeded, RequestTooLarge, TenantRequired
from scheduler.quotas import QuotaLedger
from scheduler.request import Priority
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry
from tests.unit.scheduler.helpers import req


def ledger(quotas: TenantQuotas, mode: str = "reject") -> tuple[QuotaLedger, FakeClock]:
    clock = FakeClock()
    cfg = TenantConfig("a", quotas=quotas, over_quota=mode)  # type: ignore[arg-type]
    return QuotaLedger(TenantRegistry([cfg], default_tenant_id="a"), clock), clock


def test_open_resolves_default_tenant_and_refuses_without_one() -> None:
    led, _ = ledger(TenantQuotas())
    r = req("")
    led.open(r)
    assert r.tenant_id == "a"
    bare = QuotaLedger(TenantRegistry([TenantConfig("a")]), FakeClock())
    with pytest.raises(TenantRequired):
        bare.open(req(""))


def test_caps_name_the_field_and_limit() -> None:
    led, _ = ledger(
        TenantQuotas(max_prompt_tokens=100, max_output_tokens=500, max_output_tokens_interactive=50)
    )
    with pytest.raises(RequestTooLarge) as e1:
        led.open(req("a", prompt=101))
    assert (e1.value.field, e1.value.limit) == ("prompt", "max_prompt_tokens")
    assert "101" in str(e1.value) and "100" in str(e1.value)
    with pytest.raises(RequestTooLarge) as e2:
        led.open(req("a", max_tokens=51))
    assert (e2.value.field, e2.value.limit) == (
        "sampling.max_tokens",
        "max_output_tokens_interactive",
    )
    led.open(req("a", max_tokens=500, priority=Priority.BATCH))
    with pytest.raises(RequestTooLarge) as e3:
        led.open(req("a", max_tokens=501, priority=Priority.BATCH))
    assert e3.value.limit == "max_output_tokens"
    usage = led.usage("a")
    assert usage is not None and usage.rejections == {
        "max_prompt_tokens": 1,
        "max_output_tokens_interactive": 1,
        "max_output_tokens": 1,
    }


def test_request_bigger_than_token_burst_is_too_large() -> None:
    led, _ = ledger(TenantQuotas(tokens_per_min=60, tokens_burst=50))
    with pytest.raises(RequestTooLarge, match="token burst of 50"):
        led.open(req("a", prompt=30, max_tokens=21))


def test_reject_mode_gives_exact_retry_and_binding_limit() -> None:
    led, clock = ledger(TenantQuotas(requests_per_s=10, requests_burst=5, tokens_per_min=600))
    # tokens: 10 per second, burst 600.
    led.open(req("a", prompt=250, max_tokens=250))
    with pytest.raises(QuotaExceeded) as err:
        led.open(req("a", prompt=100, max_tokens=100))
    assert err.value.limit == "tokens_per_min"
    assert err.value.retry_after_s == pytest.approx(10.0)  # 100 missing at 10/s
    assert err.value.subject == "tenant:a"
    clock.advance(10.0)
    led.open(req("a", prompt=100, max_tokens=100))


def test_max_queued_rejects_at_push_and_frees_on_settle() -> None:
    led, _ = ledger(TenantQuotas(max_queued=2))
    r1 = led.open(req("a"))
    led.open(req("a"))
    with pytest.raises(QuotaExceeded) as err:
        led.open(req("a"))
    assert err.value.limit == "max_queued" and err.value.retry_after_s is None
    led.settle(r1)
    led.open(req("a"))


def test_settle_refunds_unused_output_once() -> None:
    led, _ = ledger(TenantQuotas(tokens_per_min=6000, tokens_burst=1000))
    res = led.open(req("a", prompt=100, max_tokens=400))
    led.start(res)
    usage = led.usage("a")
    assert usage is not None and usage.token_bucket is not None
    assert usage.token_bucket.level() == pytest.approx(500)
    assert led.settle(res, output_tokens=50)
    assert usage.token_bucket.level() == pytest.approx(850)
    assert not led.settle(res, output_tokens=0)  # idempotent
    assert usage.token_bucket.level() == pytest.approx(850)
    assert usage.charged_tokens == 150
    assert usage.open_reservations == 0


def test_settle_while_queued_charges_nothing() -> None:
    led, _ = ledger(TenantQuotas(requests_per_s=1, tokens_per_min=600))
    res = led.open(req("a", prompt=100, max_tokens=100))
    usage = led.usage("a")
    assert usage is not None and usage.queued == 1
    led.settle(res)
    assert usage.charged_tokens == 0 and usage.charged_requests == 0
    assert usage.queued == 0
    assert usage.request_bucket is not None and usage.request_bucket.level() == 1


def test_output_overrun_goes_into_debt() -> None:
    led, _ = ledger(TenantQuotas(tokens_per_min=60, tokens_burst=100))
    res = led.open(req("a", prompt=10, max_tokens=10))
    led.start(res)
    led.settle(res, output_tokens=200)
    usage = led.usage("a")
    assert usage is not None and usage.token_bucket is not None
    assert usage.token_bucket.level() == pytest.approx(100 - 210)


def test_wait_mode_reserves_at_start_and_concurrency_blocks() -> None:
    led, clock = ledger(
        TenantQuotas(requests_per_s=1, requests_burst=1, max_concurrent=1), mode="wait"
    )
    r1 = led.open(req("a"))
    r2 = led.open(req("a"))  # wait mode: queued without reserving
    assert led.wait_s(r1) == 0
    led.in_flight.open("a", r1.tokens)  # as the dispatcher's budget does, before start
    led.start(r1)
    assert led.wait_s(r2) == math.inf  # at max_concurrent
    assert led.in_flight.requests_of("a") == 1
    led.in_flight.release("a", r1.tokens)
    led.settle(r1, 5)
    assert led.wait_s(r2) == pytest.approx(1.0)  # request bucket empty
    clock.advance(1.0)
    assert led.wait_s(r2) == 0
    led.start(r2)
    with pytest.raises(AssertionError):
        led.start(r2)
