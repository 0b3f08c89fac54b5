"""One request's lifecycle, told to observers that are never a step of it.

`Generation` (service/generation.py) reports its ticket's transitions as it
sees them (scheduler/gate.py `RequestState`): QUEUED (each `ObserverFactory`
is asked for an observer), ADMITTED (`admitted`, with the engine request
before it is sent: the one thing an observer may add to it is
`trace_headers`), STREAMING (`first_token`), the engine stream's end
(`engine_ended`, final usage) and SETTLED (`settled`, the result), or a
refusal at admission (`refused`, with its reason: REJECTED or EXPIRED, and a
budget refusal before the queue). The refusal is also the RPC's status:
telemetry records it through the error mapping (`errors.abort`), which also
sees calls refused before a generation exists (authentication, validation).

An observer that raises is logged once and not called again for that
request; the request goes on as if it were not there. Cost: with no observer
every hook is a no-op method of a shared object; per token only `text` runs,
and only when an observer asked for the text (`wants_text`, content capture).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.budget import AdmissionBudget
    from scheduler.request import QueuedRequest
    from service.engines.protocol import EngineRequest
    from service.models import ServedModel

log = logging.getLogger(__name__)


class LifecycleObserver(Protocol):
    """Watches one request from its admission to its settlement."""

    @property
    def wants_text(self) -> bool:
        """Whether `text` should be called with every chunk's text (per token)."""
        ...

    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None: ...

    def first_token(self) -> None: ...

    def text(self, text: str) -> None: ...

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        """The engine stream is over (finished, failed or cancelled): usage is final."""
        ...

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        """The admission is settled and the result is about to be sent (`failure`:
        the engine failed after tokens had reached the client)."""
        ...

    def refused(self, reason: str) -> None:
        """Refused before admission (`reason`: the ErrorInfo reason, e.g.
        BUDGET_EXHAUSTED, QUOTA_EXCEEDED, QUEUE_TIMEOUT); nothing else follows."""
        ...


class QuietObserver:
    """Every hook of `LifecycleObserver` (but `wants_text`) does nothing: an
    observer that watches a few of them overrides only those."""

    __slots__ = ()

    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        pass

    def first_token(self) -> None:
        pass

    def text(self, text: str) -> None:
        pass

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        pass

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        pass

    def refused(self, reason: str) -> None:
        pass


# Called when a request is queued; None: nothing to observe for this one.
ObserverFactory = Callable[
    ["QueuedRequest", "ServedModel", "str | None"], "LifecycleObserver | None"
]


class Lifecycle:
    """The observers of one request; each call goes to every observer still healthy."""

    __slots__ = ("_observers", "_request_id", "wants_text")

    def __init__(self, request_id: str, observers: list[LifecycleObserver]) -> None:
        self._request_id = request_id
        self._observers = observers
        self.wants_text = False
        self._refresh()

    @classmethod
    def start(
        cls,
        factories: Sequence[ObserverFactory],
        req: QueuedRequest,
        model: ServedModel,
        prompt: str | None,
    ) -> Lifecycle:
        if not factories:
            return NO_LIFECYCLE
        observers: list[LifecycleObserver] = []
        for factory in factories:
            try:
                observer = factory(req, model, prompt)
            except Exception as exc:  # noqa: BLE001 - an observer never fails the request
                _log_failure(req.request_id, factory, exc)
                continue
            if observer is not None:
                observers.append(observer)
        return cls(req.request_id, observers) if observers else NO_LIFECYCLE

    def _refresh(self) -> None:
        self.wants_text = any(o.wants_text for o in self._observers)

    def _tell(self, event: Callable[[LifecycleObserver], None]) -> None:
        for observer in list(self._observers):
            try:
                event(observer)
            except Exception as exc:  # noqa: BLE001 - an observer never fails the request
                _log_failure(self._request_id, observer, exc)
                self._observers.remove(observer)
                self._refresh()

    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        self._tell(lambda o: o.admitted(engine_req, budget))

    def first_token(self) -> None:
        self._tell(lambda o: o.first_token())

    def text(self, text: str) -> None:
        self._tell(lambda o: o.text(text) if o.wants_text else None)

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        self._tell(
            lambda o: o.engine_ended(prompt_tokens, completion_tokens, cached_tokens, retractions)
        )

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        self._tell(lambda o: o.settled(finish_reason, failure))

    def refused(self, reason: str) -> None:
        self._tell(lambda o: o.refused(reason))


class _NoLifecycle(QuietObserver, Lifecycle):
    """No observer: every hook returns at once (shared by every such request)."""

    __slots__ = ()


NO_LIFECYCLE: Lifecycle = _NoLifecycle("", [])


def _log_failure(request_id: str, observer: object, exc: Exception) -> None:
    log.warning(
        "request %s: observer %s failed and is dropped for it: %r",
        request_id,
        getattr(observer, "__qualname__", type(observer).__qualname__),
        exc,
        exc_info=exc,
    )
