"""The admission queue under ``admission: slo`` (``ext_proc.admit.queue`` calls these): a
request's deadline, its place in its tenant's queue, and the count of requests that waited
past their target (docs/slo.md, "Decisions").

- **Deadline** of a request with a TTFT target ``T`` on a profile with ``admission: slo``:
  ``due = enqueued + T − (time.monotonic() − arrived)`` on the queue's clock at enqueueing
  (``arrived``: ``RequestFacts.arrived_s``, when ICE read its headers; ``Waiter.ttft_due_s``);
  none (``inf``) otherwise.
- **Order.** Within its tenant's queue (priority bands and tenant turns are the queue's
  own), a request goes before the first waiter whose deadline is later than its own: earliest
  deadline first, FIFO among equal deadlines and among requests without one (``inf``). A
  profile without ``admission: slo`` keeps plain FIFO (every deadline ``inf``).
- **Wait bound.** A waiter's own deadline in the queue is ``min(enqueued +
  max_queue_wait_ms, due)``: past ``due`` it cannot make its target, and it leaves with 429
  ``slo_unreachable`` rather than waiting on (``timeout_reason``); a head judged again before
  then gets the same from the ladder (``ext_proc.policy.slo_admit``) as soon as its
  predicted TTFT no longer fits what is left of its target.
- **Late.** A request that waited and went upstream with its TTFT target already spent
  (``now > arrived + T``, on any admission mode) cannot have made its target: it is counted
  in ``ice_slo_waited_late_total{pool}``. Under ``admission: slo`` only a
  ``critical`` request (which the rule never refuses) can be.

No clock but ``due_s``'s ``time.monotonic()`` (the clock ``arrived_s`` is on); ``now`` is
the queue's.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.admit.verdict import BodyVerdict, RequestFacts
from ext_proc.admit.waiters import Waiter

if TYPE_CHECKING:
    from ext_proc.admit.routing import Route

__all__ = ["count_late", "due_s", "enqueue", "timeout_reason", "wait_bound_s"]


def due_s(facts: RequestFacts, now: float) -> float:
    """The request's TTFT deadline on the queue's clock (``now``: that clock now; ``inf``:
    no target): ``now + T − (time.monotonic() − arrived)``."""
    target = facts.slo.ttft_ms
    if target is None:
        return math.inf
    return now + target / 1000 - (time.monotonic() - facts.arrived_s)


def _by_deadline(w: Waiter) -> float:
    """The deadline the queue orders and bounds ``w`` by: under ``admission: slo`` only."""
    return w.ttft_due_s if w.route.profile.admission == "slo" else math.inf


def wait_bound_s(route: Route, due: float, limit: float) -> float:
    """A waiter's own deadline in the queue: ``min(limit, due)`` under ``admission: slo``."""
    return min(limit, due) if route.profile.admission == "slo" else limit


def enqueue(q: deque[Waiter], waiter: Waiter) -> None:
    """Put ``waiter`` before the first waiter of ``q`` whose deadline is later than its own."""
    due = _by_deadline(waiter)
    if due == math.inf:
        q.append(waiter)
        return
    for i, w in enumerate(q):
        if _by_deadline(w) > due:
            q.insert(i, waiter)
            return
    q.append(waiter)


def timeout_reason(w: Waiter, now: float) -> tuple[str, str] | None:
    """(reason, message) of a waiter whose target, not the queue's limit, ran out."""
    if now < _by_deadline(w):
        return None
    return (
        "slo_unreachable",
        f"The request waited {(now - w.enqueued_s) * 1000:.0f} ms for room on the backend; "
        f"its time-to-first-token target ({w.facts.slo.ttft_ms:.0f} ms) has passed.",
    )


def count_late(w: Waiter, verdict: BodyVerdict, now: float) -> None:
    """Count a waiter that goes upstream with its TTFT target spent (any admission mode)."""
    if verdict.goes_upstream and now > w.ttft_due_s:
        telemetry.SLO_WAITED_LATE.labels(pool=w.route.pool).inc()
