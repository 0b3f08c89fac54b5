"""The one Protocol every queueing policy implements.

The dispatcher never branches on a policy's name: FCFS, the weighted-fair VTC
policy and the rate-limit baseline all sit behind this interface.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.request import QueuedRequest


class QueuePolicy(Protocol):
    name: str
    # Fairgate's own fairness rules (the fair-share reserve) apply only under a
    # fair policy: the baselines run as the engine would alone.
    fair: bool

    def push(self, req: QueuedRequest) -> None:
        """Add a request to its queue; may raise RequestRejected (rate-limit baseline)."""
        ...

    def peek_next(self) -> QueuedRequest | None:
        """The request the policy would admit next, without removing it."""
        ...

    def order_key(self, tenant_id: str) -> float:
        """An eligible tenant's order key (a fair policy's `rules.order_key`)."""
        ...

    def heads_upto(self, key: float) -> list[QueuedRequest]:
        """The heads of the eligible tenants whose order key is at most `key`, in
        the policy's order (the locality window, `decision.window_end`; a
        baseline returns none: it admits in arrival order only)."""
        ...

    def pop_next(self, chosen: QueuedRequest | None = None) -> QueuedRequest | None:
        """Remove and return the request to admit next (`chosen`: one of
        `heads_upto`); charge its admission."""
        ...

    def remove(self, req: QueuedRequest) -> bool:
        """Drop a queued request (cancel, deadline). Charges nothing."""
        ...

    def pause(self, tenant_id: str) -> None:
        """Skip this tenant's requests until `resume`; it keeps its queue and place.

        The dispatcher pauses a tenant whose head request may not start yet
        (over quota in wait mode, at max_concurrent).
        """
        ...

    def resume(self, tenant_id: str) -> None:
        """Make a paused tenant's requests eligible again."""
        ...

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        """An admitted request produced `tokens` more output tokens."""
        ...

    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        """The engine had `reported` of an admitted request's prompt tokens cached
        (charged at admission on `req.charged_cached`)."""
        ...

    def on_finish(self, req: QueuedRequest) -> None:
        """An admitted request left the engine."""
        ...

    def forget(self, tenant_id: str) -> bool:
        """Free an idle tenant's state (nothing queued); False if it is not idle."""
        ...

    def __len__(self) -> int:
        """Number of queued (not admitted) requests."""
        ...
