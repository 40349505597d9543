"""The admission queue under ``admission: slo`` (``ext_proc.admit.queue`` calls these): a
request's deadline, its place in its tenant's queue, and the count of requests that waited
past their target (docs/slo.md, "Decisions").

- **Deadline** of a request with a TTFT target ``T`` on a profile with ``admission: slo``:
  ``due = arrived + T`` (``RequestFacts.arrived_s``, when ICE read its headers); none
  (``inf``) otherwise.
- **Order.** Within its tenant's queue (priority bands and tenant turns are the queue's
  own), a request goes before the first waiter whose deadline is later than its own: earliest
  deadline first, FIFO among equal deadlines and among requests without one (``inf``). A
  profile without ``admission: slo`` keeps plain FIFO (every deadline ``inf``).
- **Wait bound.** A waiter's own deadline in the queue is ``min(enqueued +
  max_queue_wait_ms, due)``: past ``due`` it cannot make its target, and it leaves with 429
  ``slo_unreachable`` rather than waiting on (``timeout_reason``); a head judged again before
  then gets the same from the ladder (``ext_proc.policy.slo_admit``) as soon as its
  predicted TTFT no longer fits what is left of its target.
- **Late.** A request that waited and went upstream with its TTFT target already spent in the
  wait (``now − arrived > T``, on any admission mode) cannot have made its target: it is
  counted in ``ice_slo_waited_late_total{pool}``. Under ``admission: slo`` only a
  ``critical`` request (which the rule never refuses) can be.

Pure but for the metric: no clock (``now`` comes in).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.admit.verdict import BodyVerdict, RequestFacts
from ext_proc.admit.waiters import Waiter

if TYPE_CHECKING:
    from ext_proc.admit.routing import Route

__all__ = ["count_late", "due_s", "enqueue", "timeout_reason"]


def due_s(route: Route, facts: RequestFacts) -> float:
    """``arrived + T`` under ``admission: slo`` with a TTFT target, else ``inf``."""
    target = facts.slo.ttft_ms
    if route.profile.admission != "slo" or target is None:
        return math.inf
    return facts.arrived_s + target / 1000


def enqueue(q: deque[Waiter], waiter: Waiter) -> None:
    """Put ``waiter`` before the first waiter of ``q`` whose deadline is later than its own."""
    due = due_s(waiter.route, waiter.facts)
    if due == math.inf:
        q.append(waiter)
        return
    for i, w in enumerate(q):
        if due_s(w.route, w.facts) > due:
            q.insert(i, waiter)
            return
    q.append(waiter)


def timeout_reason(w: Waiter, now: float) -> tuple[str, str] | None:
    """(reason, message) of a waiter whose target, not the queue's limit, ran out."""
    due = due_s(w.route, w.facts)
    if now < due:
        return None
    target = w.facts.slo.ttft_ms
    return (
        "slo_unreachable",
        f"The request waited {(now - w.enqueued_s) * 1000:.0f} ms for room on the backend; "
        f"its time-to-first-token target ({target:.0f} ms) has passed.",
    )


def count_late(w: Waiter, verdict: BodyVerdict, now: float) -> None:
    """Count a waiter that goes upstream with its TTFT target spent in the wait."""
    target = w.facts.slo.ttft_ms
    if target is None or not verdict.goes_upstream:
        return
    if now - w.facts.arrived_s > target / 1000:
        telemetry.SLO_WAITED_LATE.labels(pool=w.route.pool).inc()
