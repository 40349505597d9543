"""The admission queue: a request that would be shed for memory waits for room instead.

A verdict that is a ``Wait`` (the ladder's answer, on a profile with ``queue``, for a request
refused only for memory now: ``memory_pressure`` or ``kv_exhausted``; ``queueable``) is not
sent: ``AdmissionQueue.offer`` holds the request (its first
verdict, with its body's one decode) in its pool's queue, and the stream asks Envoy for the wait
(``override_message_timeout``) and awaits ``wait``. Each worker has one ``AdmissionQueue``.

Order (``tick``, every ``poll_ms`` while anything waits, and at the earliest deadline):

1. A waiter whose deadline (enqueued + ``max_queue_wait_ms``) has passed gets 429
   ``queue_timeout`` with the first verdict's Retry-After (the pool's drain estimate).
2. Bands by priority: ``critical``, ``standard``, then ``sheddable``. A lower band is tried
   only when no request of a higher band is left waiting: a request of a higher band that
   does not fit holds back the lower ones. ``critical`` is never shed, so it waits only on a
   profile whose queue has ``critical: wait`` (``Profile.critical_waits``: the ladder's rule
   4 then answers a critical request whose blocks do not fit with a ``Wait``),
   and it is never refused: at its deadline, when the queue is full and when ICE stops, it is
   judged once more without the wait (``Pipeline.rejudge``) and goes upstream as that
   verdict says (outcome ``passed``), over the room, as it would have without the queue.
   While one waits, a lower band's request that would go upstream waits behind it
   (``behind_critical``): smaller ones arriving later do not take the room it waits for.
3. Within a band, tenants take turns, FIFO within a tenant (under ``admission: slo``,
   earliest TTFT deadline first: ``ext_proc.admit.slo_queue``): the tenant with the fewest
   requests in flight goes first (``started`` / ``ended``: a request of a queue-enabled
   profile that went upstream, queued or not, until its stream ends), and among equals the
   one served longest ago (round robin). Counting what is in flight, not only what was
   queued, keeps a tenant whose requests went straight in while the pool had room from also
   taking the next turns: each tenant's share of the pool's slots tends to an equal one. The
   head of each tenant's queue, in that order, is judged again
   (``Pipeline.rejudge``: the same features against the pool's view now and the in-flight
   ledger, the ladder without history truncation). A head that still gets a ``Wait``
   stays; any other verdict (pass, downgrade, or a refusal) is its answer: it is committed at
   once, so its KV blocks count in the ledger before the next head is judged, and its stream
   wakes with ``x-ice-queued-ms``. A tenant whose head stays does not hold up the others.

Refused at once (429 ``queue_full``): a request when its pool's queue in this worker holds
``max_queue_length`` requests, or ``max_queue_bytes`` of bodies. When ICE shuts down
(``close``), every waiter, and every request offered after, gets 429 ``queue_shutdown``
(``critical`` ones pass, above).

Tenants: ``ext_proc.admit.identity.request_tenant`` (the route's identity, else the profile's
``tenant_header``, else the route's name), printable
ASCII only, at most ``MAX_TENANT_CHARS`` characters. At most ``max_tenants`` tenants have a
queue of their own per pool and band at a time; a request of any other tenant joins the
shared ``OTHER_TENANT`` queue. Metric labels name the first ``max_tenants`` tenants a worker
sees per pool, then ``other``: memory and label values stay bounded whatever clients send.

A stream that ends while queued (the client left, Envoy's timeout, ICE shutting down) leaves
the queue at once (``wait`` is cancelled): it never reaches the backend, holds no blocks.

Invariants: every waiter is in exactly one tenant queue until its future is resolved or it
is cancelled, and then in none; ``depth`` = the waiters in queues; a waiter's verdict is
recorded by the queue (``Pipeline.record``) exactly once, unless it is gone; runs on the
event loop's thread only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.admit.counting import exact_to_wait
from ext_proc.admit.identity import request_tenant
from ext_proc.admit.queue_answers import H_QUEUED_MS, behind_critical, refusal, with_queued_ms
from ext_proc.admit.slo_queue import count_late, due_s, enqueue, timeout_reason, wait_bound_s
from ext_proc.admit.stream import Stream
from ext_proc.admit.verdict import BodyVerdict, RequestFacts
from ext_proc.admit.waiters import (
    BANDS,
    OTHER_TENANT,
    Band,
    PoolQueues,
    Waiter,
    band_of,
    body_bytes,
    queueable,
)
from ext_proc.policy.settings import QueueSpec
from ext_proc.policy.tenant_share import TENANT_SHARE_REASONS

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline, Route

__all__ = [
    "BANDS",
    "H_QUEUED_MS",
    "OTHER_TENANT",
    "AdmissionQueue",
    "Waiter",
    "queueable",
]

log = logging.getLogger("ice.queue")

DEFAULT_MAX_QUEUE_BYTES = 64 * 1024 * 1024


def _metric_label(pool: PoolQueues, tenant: str, max_tenants: int) -> str:
    """The queue metrics' tenant label: the first ``max_tenants`` tenants seen by name, every
    later one ``OTHER_TENANT`` (bounded cardinality)."""
    if tenant in pool.labels or len(pool.labels) < max_tenants:
        pool.labels.add(tenant)
        return tenant
    return OTHER_TENANT


class AdmissionQueue:
    """One worker's queues, one per pool (see the module docstring)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
    ) -> None:
        self._clock = clock
        self._pools: dict[str, PoolQueues] = {}
        self._task: asyncio.Task[None] | None = None
        self.max_queue_bytes = max_queue_bytes
        self.closed = False
        # (pool, tenant) → its requests in flight (``started`` less ``ended``; no zeros)
        self.inflight: dict[tuple[str, str], int] = {}

    def started(self, pool: str, tenant: str) -> None:
        """A request of ``tenant`` went upstream to ``pool`` (its stream calls ``ended``)."""
        key = (pool, tenant)
        self.inflight[key] = self.inflight.get(key, 0) + 1

    def count_started(
        self, route: Route, facts: RequestFacts, stream: Stream, verdict: BodyVerdict
    ) -> None:
        """``started`` for a verdict that sends the request upstream on a queue-enabled
        profile (once per request: its stream's ``slot`` remembers it for ``ended``)."""
        if route.profile.queue is None or stream.slot is not None:
            return
        if not verdict.goes_upstream:
            return
        stream.slot = (route.pool, request_tenant(route, facts))
        self.started(*stream.slot)

    def ended(self, pool: str, tenant: str) -> None:
        """A request ``started`` is over."""
        key = (pool, tenant)
        left = self.inflight.get(key, 0) - 1
        if left > 0:
            self.inflight[key] = left
        else:
            self.inflight.pop(key, None)

    @property
    def depth(self) -> int:
        return sum(p.length for p in self._pools.values())

    def offer(
        self,
        pipeline: Pipeline,
        route: Route,
        facts: RequestFacts,
        stream: Stream,
        first: BodyVerdict,
        *,
        commit: Callable[[BodyVerdict], None],
    ) -> Waiter | BodyVerdict:
        """Queue a ``queueable`` request, or its 429 ``queue_full`` (not committed);
        ``commit``: what commits its verdict once it is judged again
        (``ext_proc.admit.admission.Admission.commit``)."""
        spec = route.profile.queue
        assert spec is not None
        pool = self._pools.setdefault(route.pool, PoolQueues())
        tenant = request_tenant(route, facts)
        label = _metric_label(pool, tenant, spec.max_tenants)
        first = exact_to_wait(pipeline.counters, pipeline.policy.exact_count_inline_bytes, first)
        nbytes = body_bytes(first)
        band_name = band_of(route, facts, first)
        refused = self._refused_at_once(pool, spec, nbytes)
        if refused is not None:
            outcome, reason, message = refused
            critical = band_name == "critical"  # never refused: it goes as it would have
            outcome = "passed" if critical else outcome
            telemetry.QUEUE_OUTCOMES.labels(pool=route.pool, tenant=label, outcome=outcome).inc()
            if critical:
                return pipeline.rejudge(route, facts, first)
            return refusal(pipeline, route, facts, first, reason, message)
        band = pool.bands[band_name]
        if tenant not in band.tenants and len(band.tenants) >= spec.max_tenants:
            tenant = OTHER_TENANT
        now = self._clock()
        due = due_s(facts, now)
        waiter = Waiter(
            pipeline,
            route,
            facts,
            stream,
            first,
            tenant,
            label,
            band_name,
            now,
            wait_bound_s(route, due, now + spec.max_queue_wait_ms / 1000),
            asyncio.get_running_loop().create_future(),
            commit,
            due,
        )
        enqueue(band.tenants.setdefault(tenant, deque()), waiter)  # by deadline (slo_queue)
        pipeline.views.tenants.wait_started(route.pool, waiter.share_tenant)
        pool.length += 1
        pool.nbytes += nbytes
        telemetry.QUEUE_DEPTH.labels(pool=route.pool, priority=waiter.band).inc()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._pump())
        return waiter

    def behind_critical(
        self, route: Route, facts: RequestFacts, verdict: BodyVerdict | None
    ) -> BodyVerdict | None:
        """``verdict``, or the 429 queueing it behind a critical waiter of its pool here."""
        pool = self._pools.get(route.pool)
        if pool is None or not pool.bands["critical"].tenants:
            return verdict
        return behind_critical(route, facts, verdict)

    def _refused_at_once(
        self, pool: PoolQueues, spec: QueueSpec, nbytes: int
    ) -> tuple[str, str, str] | None:
        """(outcome label, reason, message) of a request the queue cannot take now."""
        if self.closed:
            message = "The gateway's admission queue is shutting down; the backend has no room."
            return "shutdown", "queue_shutdown", message
        if pool.length >= spec.max_queue_length or pool.nbytes + nbytes > self.max_queue_bytes:
            what = f"{pool.length} requests" if pool.length >= spec.max_queue_length else "bytes"
            message = f"The admission queue is full ({what} waiting); the backend has no room."
            return "full", "queue_full", message
        return None

    async def wait(self, waiter: Waiter) -> BodyVerdict:
        """The waiter's verdict (committed); a cancelled wait leaves the queue at once."""
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if self._remove(waiter):
                self._count(waiter, "gone")
            raise

    def tick(self) -> None:
        """Time out, then admit what the pools' views have room for (module docstring)."""
        now = self._clock()
        for pool_name, pool in self._pools.items():
            for band in pool.bands.values():
                for q in list(band.tenants.values()):
                    for w in [w for w in q if w.deadline_s <= now]:
                        self._remove(w)
                        if w.band == "critical":
                            self._pass(w, now)
                        else:
                            self._resolve(w, self._timed_out(w, now), "timeout", now)
            for name in BANDS:
                band = pool.bands[name]
                self._admit(pool_name, band, now)
                if band.tenants:  # a higher band still waits: the lower ones wait too
                    break

    def _admit(self, pool: str, band: Band, now: float) -> None:
        progress = True
        inflight = self.inflight
        while progress and band.tenants:
            progress = False
            # fewest in flight first; sorted() is stable: equals keep the round-robin order
            turns = sorted(band.tenants.items(), key=lambda t: inflight.get((pool, t[0]), 0))
            for tenant, q in turns:
                w = q[0]
                try:
                    critical = w.band == "critical"
                    verdict = w.pipeline.rejudge(w.route, w.facts, w.first, waits=critical)
                except Exception as e:  # fail the stream (its fail_mode decides), not the queue
                    self._remove(w)
                    _fail(w, e)
                    progress = True
                    break
                if queueable(w.route, verdict):
                    assert verdict.decision is not None
                    w.reason = verdict.decision.reason
                    continue
                self._remove(w)
                if band.tenants.get(tenant):
                    band.tenants.move_to_end(tenant)
                self._resolve(w, verdict, "admitted", now)
                progress = True
                break

    def _pass(self, w: Waiter, now: float) -> None:
        """A critical waiter (out of its queue) goes upstream as judged without the wait."""
        try:
            verdict = w.pipeline.rejudge(w.route, w.facts, w.first)
        except Exception as e:
            _fail(w, e)
            return
        self._resolve(w, verdict, "passed", now)

    def _timed_out(self, w: Waiter, now: float) -> BodyVerdict:
        waited = now - w.enqueued_s
        missed = timeout_reason(w, now)
        if missed is not None:  # its TTFT target, not the queue's limit, ran out
            return refusal(w.pipeline, w.route, w.facts, w.first, *missed)
        why = w.reason or (w.first.decision.reason if w.first.decision is not None else "")
        if why in TENANT_SHARE_REASONS:  # its own reason: its tenant's share held it back
            return refusal(
                w.pipeline,
                w.route,
                w.facts,
                w.first,
                why,
                f"The request waited {waited * 1000:.0f} ms for its tenant's share of the "
                f"backend (the limit is {w.spec.max_queue_wait_ms} ms).",
            )
        return refusal(
            w.pipeline,
            w.route,
            w.facts,
            w.first,
            "queue_timeout",
            f"The request waited {waited * 1000:.0f} ms for room on the backend (the limit is "
            f"{w.spec.max_queue_wait_ms} ms).",
        )

    def _resolve(self, w: Waiter, verdict: BodyVerdict, outcome: str, now: float) -> None:
        if w.future.done():  # cancelled in the meantime
            return
        verdict = with_queued_ms(verdict, now - w.enqueued_s)
        count_late(w, verdict, now)
        w.commit(verdict)  # held (released by its stream) before the next is judged
        w.future.set_result(verdict)
        self._count(w, outcome, now)

    def _count(self, w: Waiter, outcome: str, now: float | None = None) -> None:
        waited = (self._clock() if now is None else now) - w.enqueued_s
        pool = w.route.pool
        telemetry.QUEUE_WAIT_SECONDS.labels(pool=pool, outcome=outcome).observe(waited)
        telemetry.QUEUE_OUTCOMES.labels(pool=pool, tenant=w.label, outcome=outcome).inc()

    def _remove(self, w: Waiter) -> bool:
        """Take ``w`` out of its queue; False when it was not in one."""
        pool = self._pools.get(w.route.pool)
        if pool is None:
            return False
        band = pool.bands[w.band]
        q = band.tenants.get(w.tenant)
        if q is None or w not in q:
            return False
        q.remove(w)
        w.pipeline.views.tenants.wait_ended(w.route.pool, w.share_tenant)
        if not q:
            del band.tenants[w.tenant]
        pool.length -= 1
        pool.nbytes -= w.nbytes
        telemetry.QUEUE_DEPTH.labels(pool=w.route.pool, priority=w.band).dec()
        return True

    def _waiters(self) -> list[Waiter]:
        return [
            w
            for p in self._pools.values()
            for b in p.bands.values()
            for q in b.tenants.values()
            for w in q
        ]

    async def _pump(self) -> None:
        """Tick while anything waits: every poll_ms, and at the earliest deadline."""
        while True:
            waiters = self._waiters()
            if not waiters:
                return
            now = self._clock()
            poll = min(w.spec.poll_ms for w in waiters) / 1000
            due = min(w.deadline_s for w in waiters) - now
            await asyncio.sleep(max(0.0, min(poll, due)))
            try:
                self.tick()
            except Exception:  # never leave waiters without a pump
                log.exception("admission queue tick failed")

    def close(self) -> None:
        """ICE is shutting down: every waiter gets 429 ``queue_shutdown`` (with Retry-After)
        now, rather than a pass Envoy would give it unjudged when the stream is cut; later
        offers get it at once."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        now = self._clock()
        for w in self._waiters():
            self._remove(w)
            if w.band == "critical":
                self._pass(w, now)
                continue
            verdict = refusal(
                w.pipeline,
                w.route,
                w.facts,
                w.first,
                "queue_shutdown",
                "The gateway's admission queue is shutting down; the backend had no room.",
            )
            self._resolve(w, verdict, "shutdown", now)


def _fail(w: Waiter, e: Exception) -> None:
    """Fail a waiter's stream (its fail_mode decides), not the queue."""
    if not w.future.done():
        w.future.set_exception(e)
