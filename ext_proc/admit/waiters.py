"""What waits in the admission queue (``ext_proc.admit.queue``): a queued request
(``Waiter``), a pool's queues (``PoolQueues``: its priority ``Band``s, each tenant → FIFO),
which verdicts queue (``queueable``) and a request's band (``band_of``); its tenant is
``ext_proc.admit.identity.request_tenant``'s.

Invariants: plain data and pure functions. The queue's order, its clock, and what tenants and
bands mean live in ``ext_proc.admit.queue`` (its docstring).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ext_proc.admit.identity import request_tenant
from ext_proc.admit.stream import Stream
from ext_proc.admit.verdict import BodyVerdict, RequestFacts
from ext_proc.policy.decision import Wait
from ext_proc.policy.settings import QueueSpec

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline, Route

__all__ = [
    "BANDS",
    "OTHER_TENANT",
    "Band",
    "PoolQueues",
    "Waiter",
    "band_of",
    "body_bytes",
    "queueable",
]

OTHER_TENANT = "other"
BANDS = ("critical", "standard", "sheddable")


def queueable(route: Route, verdict: BodyVerdict | None) -> bool:
    """A verdict the profile's queue takes: a ``Wait``, on a full judgement or a coarse one
    (``ext_proc.policy.coarse``; ``evaluate`` gives one only where the profile has a
    queue)."""
    if verdict is None or not isinstance(verdict.decision, Wait):
        return False
    # a coarse verdict (judged by its size) waits too, and is judged again by the coarse
    # ladder (``Pipeline.rejudge``)
    return verdict.pending is None and verdict.features is not None


def body_bytes(verdict: BodyVerdict) -> int:
    """The bytes of the body ``verdict`` was judged on (0: judged without it)."""
    return len(verdict.body.raw) if verdict.body is not None else 0


@dataclass(eq=False)
class Waiter:
    """One queued request."""

    pipeline: Pipeline
    route: Route
    facts: RequestFacts
    stream: Stream  # its hold and slot, once it is admitted
    first: BodyVerdict  # the 429 it would have had (with its body's one decode)
    tenant: str  # its queue
    label: str  # its metrics label
    band: str
    enqueued_s: float
    deadline_s: float
    future: asyncio.Future[BodyVerdict] = field(repr=False)
    # commits its verdict once it is judged again (``Admission.commit``), before the next
    # waiter is judged
    commit: Callable[[BodyVerdict], None] = field(repr=False)
    # its TTFT target's deadline on the queue's clock (inf: none; ext_proc.admit.slo_queue)
    ttft_due_s: float = math.inf
    reason: str = ""  # why it waits, as last judged ("": as ``first``)

    @property
    def share_tenant(self) -> str:
        """The tenant its tenant share counts (``ext_proc.admit.tenant_shares``)."""
        return request_tenant(self.route, self.facts)

    @property
    def spec(self) -> QueueSpec:
        assert self.route.profile.queue is not None
        return self.route.profile.queue

    @property
    def nbytes(self) -> int:
        """Its body's bytes, which count against ``max_queue_bytes``."""
        return body_bytes(self.first)


class Band:
    """A priority band of one pool: tenant → FIFO, the tenant served longest ago first."""

    __slots__ = ("tenants",)

    def __init__(self) -> None:
        self.tenants: OrderedDict[str, deque[Waiter]] = OrderedDict()


@dataclass
class PoolQueues:
    bands: dict[str, Band] = field(default_factory=lambda: {b: Band() for b in BANDS})
    length: int = 0
    nbytes: int = 0
    labels: set[str] = field(default_factory=set)  # tenants named in metrics


def band_of(route: Route, facts: RequestFacts, first: BodyVerdict) -> str:
    """The band a request waits in: ``critical`` for one sent to wait by ``critical: wait``
    (judged on its body); a coarse ``critical`` verdict (refused for the level's output cap,
    which an unread body cannot be held to) waits in ``standard``, and is refused as one."""
    if facts.priority == "critical":
        waits = route.profile.critical_waits and first.body is not None
        return "critical" if waits else "standard"
    return facts.priority if facts.priority in BANDS else "standard"
