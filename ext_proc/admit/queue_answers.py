"""The answers the admission queue (``ext_proc.admit.queue``) gives a request: the 429 of one
it refuses (its first verdict's Retry-After, the pool's pressure now), the ``x-ice-queued-ms``
header of one it admits, and the ``Wait`` that sends a request to wait behind a critical one
(``behind_critical``). Functions of their arguments; ``refusal`` also reads the pool's
pressure now from the pipeline's views."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ext_proc.admit.counting import H_TOKENS
from ext_proc.admit.verdict import BodyVerdict, RequestFacts, make_verdict, with_header
from ext_proc.policy.coarse import H_JUDGED
from ext_proc.policy.decision import Downgrade, Pass, Reject, Wait

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline
    from ext_proc.admit.routing import Route

__all__ = ["H_QUEUED_MS", "behind_critical", "refusal", "with_queued_ms"]

H_QUEUED_MS = "x-ice-queued-ms"


def with_queued_ms(verdict: BodyVerdict, waited_s: float) -> BodyVerdict:
    """The verdict with ``x-ice-queued-ms`` (to the backend and the client)."""
    headers = [*verdict.outcome.headers, (H_QUEUED_MS, str(round(waited_s * 1000)))]
    return replace(verdict, outcome=replace(verdict.outcome, headers=headers))


def refusal(
    pipeline: Pipeline,
    route: Route,
    facts: RequestFacts,
    first: BodyVerdict,
    reason: str,
    message: str,
) -> BodyVerdict:
    """A 429 ``reason`` for a queued (or queue-refused) request, with the first verdict's
    Retry-After and the pool's pressure now."""
    d = first.decision
    assert isinstance(d, Wait) and first.features is not None and facts.adapter is not None
    assert first.placement is not None
    pressure = pipeline.views.pressure(route.profile, pipeline.lookup(route.pool))
    retry = d.retry_after_s
    text = f"{message} Retry after {retry} s." if retry is not None else message
    decision = Reject(pressure, 429, reason, text, retry_after_s=retry)
    verdict = make_verdict(decision, first.features, facts.adapter, None, first.placement)
    if first.body is None:  # a coarse verdict's refusal says so (x-ice-judged: headers)
        verdict = with_header(verdict, H_JUDGED, "headers")
    return verdict


def behind_critical(
    route: Route, facts: RequestFacts, verdict: BodyVerdict | None
) -> BodyVerdict | None:
    """For a request judged on its body that would go upstream (pass or downgrade) while a
    critical request of its pool waits in the worker's queue (``critical: wait``; the caller
    knows it waits), a ``Wait`` (reason ``behind_critical``) in the request's own, lower
    band, so that smaller requests arriving later do not take the room the critical one waits
    for; any other verdict as it is."""
    if verdict is None or facts.priority == "critical" or not route.profile.critical_waits:
        return verdict
    d, f, placed = verdict.decision, verdict.features, verdict.placement
    if not isinstance(d, Pass | Downgrade) or f is None or placed is None:
        return verdict
    if verdict.body is None or verdict.pending is not None or facts.adapter is None:
        return verdict
    text = "A critical request waits for room on this backend; this one waits behind it."
    wait = Wait(d.pressure, "behind_critical", text, retry_after_s=route.profile.retry_after_s)
    behind = make_verdict(wait, f, facts.adapter, verdict.body, placed)
    for key, value in verdict.outcome.headers:
        if key == H_TOKENS:  # how its input was counted, as rejudge keeps it
            behind = with_header(behind, key, value)
    return behind
