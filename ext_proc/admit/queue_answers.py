"""The answers the admission queue (``ext_proc.admit.queue``) gives a request as it leaves:
the 429 of one it refuses (its first verdict's Retry-After, the pool's pressure now), and the
``x-ice-queued-ms`` header of one it admits. Pure functions of their arguments."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ext_proc.admit.headeronly import H_JUDGED
from ext_proc.admit.verdict import BodyVerdict, RequestFacts, make_verdict, with_header
from ext_proc.policy.decision import Reject

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline, Route

__all__ = ["H_QUEUED_MS", "refusal", "with_queued_ms"]

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
    assert isinstance(d, Reject) and first.features is not None and facts.adapter is not None
    assert first.placement is not None
    pressure = pipeline.views.pressure(route.profile, pipeline.lookup(route.pool))
    retry = d.retry_after_s
    text = f"{message} Retry after {retry} s." if retry is not None else message
    decision = Reject(pressure, 429, reason, text, retry_after_s=retry)
    verdict = make_verdict(decision, first.features, facts.adapter, None, first.placement)
    if first.body is None:  # a coarse verdict's refusal says so (x-ice-judged: headers)
        verdict = with_header(verdict, H_JUDGED, "headers")
    return verdict
