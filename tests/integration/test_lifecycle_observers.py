"""Telemetry is an observer of a request's lifecycle, never a step of it: an
observer that fails (at creation or at any event) is logged and dropped for
that request, which streams, settles and reports as if it were not there."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from fairgate import AsyncClient

from scheduler.budget import AdmissionBudget
from scheduler.request import QueuedRequest
from service.engines.protocol import EngineRequest
from service.lifecycle import LifecycleObserver, ObserverFactory
from service.models import ServedModel
from service.telemetry.telemetry import Telemetry
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually
from tests.telemetry_helpers import Captured, make_captured

GENERATE = "fairgate.v1.InferenceService/Generate"


class Broken(RuntimeError):
    pass


class FailingObserver:
    """Raises at every event; asks for the text so that even the per-token hook runs."""

    wants_text = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _fail(self, event: str) -> None:
        self.calls.append(event)
        raise Broken(f"observer down at {event}")

    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        self._fail("admitted")

    def first_token(self) -> None:
        self._fail("first_token")

    def text(self, text: str) -> None:
        self._fail("text")

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        self._fail("engine_ended")

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        self._fail("settled")

    def refused(self, reason: str) -> None:
        self._fail("refused")


class TelemetryWithFailures(Telemetry):
    """The real telemetry observer, then one observer failing at its first event
    and one factory failing at creation."""

    made: list[FailingObserver]

    @property
    def observers(self) -> tuple[ObserverFactory, ...]:
        return (*super().observers, self._failing, _refusing)

    def _failing(
        self, req: QueuedRequest, model: ServedModel, prompt: str | None
    ) -> LifecycleObserver:
        if not hasattr(self, "made"):
            self.made = []
        self.made.append(FailingObserver())
        return self.made[-1]


def _refusing(req: QueuedRequest, model: ServedModel, prompt: str | None) -> None:
    raise Broken("factory down")


@pytest.fixture
def cap() -> Captured:
    return make_captured(capture_content=True, telemetry_cls=TelemetryWithFailures)


def _made(cap: Captured) -> list[FailingObserver]:
    assert isinstance(cap.telemetry, TelemetryWithFailures)
    return cap.telemetry.made


async def test_failing_observers_never_fail_a_grpc_request(
    start_server: StartServer,
    cap: Captured,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = await start_server(telemetry=cap.telemetry)
    with caplog.at_level(logging.WARNING, logger="service.lifecycle"):
        async with AsyncClient(app.address) as client:
            done = await client.complete("hello there", max_tokens=6, ignore_eos=True)
    assert done.result.usage.completion_tokens == 6 and done.text
    # Called once, at its first event, then dropped for the request.
    assert [o.calls for o in _made(cap)] == [["admitted"]]
    failures = [r.getMessage() for r in caplog.records if "observer" in r.getMessage()]
    assert len(failures) == 2 and "factory down" in " ".join(failures)
    # The real observer (telemetry) still saw the whole lifecycle.
    await eventually(lambda: len(cap.finished(GENERATE)) == 1, what="server span")
    server = cap.finished(GENERATE)[0]
    attrs = dict(server.attributes or {})
    assert attrs["gen_ai.usage.output_tokens"] == 6 and "fairgate.time_to_first_token_s" in attrs
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    events = {e.name: dict(e.attributes or {}) for e in server.events}
    assert events["gen_ai.content.completion"]["gen_ai.completion"] == done.text
    assert len(cap.finished(f"text_completion {app.models.default}")) == 1
    await assert_no_leaks(app)


async def test_failing_observers_never_fail_an_http_request(
    start_server: StartServer,
    cap: Captured,
) -> None:
    app = await start_server(telemetry=cap.telemetry, http_listen="127.0.0.1:0")
    assert app.http is not None
    body = {"model": app.models.default, "prompt": "hello", "max_tokens": 5, "ignore_eos": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{app.http.url}/completions", json=body) as resp,
    ):
        answer = await resp.json()
    assert resp.status == 200 and answer["usage"]["completion_tokens"] == 5
    assert [o.calls for o in _made(cap)] == [["admitted"]]
    await assert_no_leaks(app)
