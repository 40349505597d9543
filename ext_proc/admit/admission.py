"""Admission: one request's way from its headers and body to a verdict, with no gRPC.

The gRPC shell (``ext_proc.serve.servicer``) turns each ext_proc message into one call here
and each step this module yields into one message; nothing else in the shell decides.
Each phase is an async generator of ``Step``s: any number of ``Extend`` (ask Envoy to wait
longer: the admission queue's wait, truncation's embeddings), then exactly one answer, last.

The headers (``on_headers``): read once (``Pipeline.on_headers``); an answer without a body
(``Immediate``), a body that passes unjudged (``SkipBody``), or a body to judge
(``Proceed``). A body with a ``content-length`` is promised its place in the worker's
backlog here; a busy worker judges it from that size now (the coarse verdict,
``Coarse``), and a memory refusal on a route with a queue waits in it first.

The body (``on_body``), in order:
1. its verdict (``_judge``): in full, inline or in the helper process, within Envoy's time
   (``Backlog.late``, the exact-count budget), or from its size when it came too late to be
   read in time; a chunked body is admitted to the backlog here, by its size; ``GONE`` when
   Envoy can no longer hear the answer;
2. a request behind a critical waiter of its pool waits behind it (``queue.behind_critical``);
3. a pending truncation is finished (``ext_proc.admit.truncation``), or a memory refusal on
   a route with a queue waits in it (``ext_proc.admit.queue``);
4. with the replicas' shared ledger active, the verdict is held and reserved there
   (``ext_proc.admit.shared_ledger.admit_shared``), judged again on a conflict;
5. the verdict is committed (``commit``) and answered (``Judged``); a request that goes on
   is counted exactly later when it was held at the estimate's bound (the recount).

Invariant: every verdict that is answered is committed exactly once (``commit``: counted in
the metrics, its blocks held in the ledger and shared with the replicas, its tenant's slot
counted), whichever way it came: here, in the queue (the waiter's ``commit``), or after the
shared ledger's reservation (its hold given). ``Stream.committed`` makes a second call a
no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from ext_proc import telemetry
from ext_proc.admit import overload_answer
from ext_proc.admit.backlog import SMALL_BODY_BYTES, Backlog, BodyClock, Lane, Ticket, Weight
from ext_proc.admit.identity import NOTHING_VOUCHED, Vouched, request_tenant
from ext_proc.admit.outcome import Continue, Outcome, Respond, priority_fields, slo_headers
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue, Waiter, queueable
from ext_proc.admit.shared_ledger import admit_shared, share_hold
from ext_proc.admit.stream import Stream
from ext_proc.admit.tenant_shares import recheck
from ext_proc.admit.truncation import finish_truncation
from ext_proc.placement.inflight import Hold

__all__ = [
    "GONE",
    "Admission",
    "Coarse",
    "Extend",
    "Helper",
    "Immediate",
    "Judged",
    "Proceed",
    "Recount",
    "SkipBody",
    "Step",
    "Untouched",
    "log_dropped",
]

log = logging.getLogger("ice.servicer")


def log_dropped(rid: str, why: str) -> None:
    """A request whose verdict Envoy stopped waiting for because ICE's answer was late,
    logged with its ``x-request-id`` (also counted in ``ice_bodies_dropped_total``). The
    shipped Envoy configs answer it 429 ``ice_late`` (``envoygen.late_guard``); Envoy's
    ``failure_mode_allow`` alone would send it on unjudged."""
    log.warning("request %s got no verdict in time: %s", rid or "without x-request-id", why)


class Helper(Protocol):
    """The helper process, as admission sees it (``ext_proc.serve.offload.Offload``)."""

    def weigh(self, pipeline: Pipeline, body: bytes) -> Weight: ...

    async def on_body(
        self, pipeline: Pipeline, route: Route, facts: RequestFacts, body: bytes, weight: Weight
    ) -> BodyVerdict | None: ...


# A held request counted exactly after its answer (``ext_proc.serve.recount``): the route,
# facts, verdict, hold and the body as Envoy sent it.
Recount = Callable[[Route, RequestFacts, BodyVerdict | None, Hold | None, bytes], None]


@dataclass(frozen=True, slots=True)
class Extend:
    """Ask Envoy to wait ``ms`` more for this message's answer (it is not the answer)."""

    ms: int


@dataclass(frozen=True, slots=True)
class Immediate:
    """Answer the request now, without its body (a 4xx in its API's format)."""

    respond: Respond


@dataclass(frozen=True, slots=True)
class SkipBody:
    """The body passes unjudged (not an inference request, or a shadow profile's refusal)."""


@dataclass(frozen=True, slots=True)
class Proceed:
    """Send the body to be judged; ``watch``: also ask for the response headers."""

    watch: bool


@dataclass(frozen=True, slots=True)
class Coarse:
    """The verdict from the body's size, at the headers (a busy worker)."""

    outcome: Outcome
    watch: bool


@dataclass(frozen=True, slots=True)
class Judged:
    """The body's verdict: its edits, or an answer."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Untouched:
    """The body goes on as it came, unjudged (not an inference body, or Envoy gave up)."""


Step = Extend | Immediate | SkipBody | Proceed | Coarse | Judged | Untouched

# The verdict of a body Envoy has given up on: answered with a plain continue, not counted.
GONE = BodyVerdict(None, None, Continue([], None))


def with_profile(outcome: Outcome, route: Route, facts: RequestFacts) -> Outcome:
    """The access log's ``profile`` and priority fields: the profile the request was judged
    under, its priority, and a priority header's claim ICE did not take; and the latency
    targets used (``x-ice-slo-ttft-ms`` / ``x-ice-slo-tpot-ms``, docs/slo.md), when set;
    the tenant and where it came from (``tenant``, ``identity``; docs/identity.md)."""
    fields = (
        ("profile", route.profile.name),
        *priority_fields(facts.priority, facts.priority_claimed),
        ("tenant", request_tenant(route, facts)),
        *((("identity", facts.identity_source),) if facts.identity_source else ()),
    )
    targets = slo_headers(facts.slo)
    log = (*outcome.log, *fields)
    if targets:
        return replace(outcome, headers=[*outcome.headers, *targets], log=log)
    return replace(outcome, log=log)


class Admission:
    """One stream's way to its verdict: the pipeline and helper in force when the stream
    opened, and what the worker's streams share (backlog, gate, queue, recount)."""

    def __init__(
        self,
        *,
        pipeline: Pipeline,
        helper: Helper | None,
        route: Route,
        stream: Stream,
        backlog: Backlog,
        gate: asyncio.Lock,
        queue: AdmissionQueue,
        recount: Recount,
    ) -> None:
        self.pipeline = pipeline
        self.helper = helper
        self.route = route
        self.stream = stream
        self.backlog = backlog
        self.gate = gate  # long bodies judged in-process: one at a time
        self.queue = queue
        self.recount = recount
        self.facts = RequestFacts(priority=route.default_priority)
        self.rid = ""  # Envoy's x-request-id (set by the shell from the headers), for the logs

    # --- committing ----------------------------------------------------------------------

    def commit(
        self, verdict: BodyVerdict, *, held: Hold | None = None, shared: bool = False
    ) -> None:
        """Count ``verdict`` in the metrics, hold its blocks, share the hold with the
        replicas and count its tenant's slot: once per stream (later calls do nothing).
        ``shared``: the shared ledger already held (``held``) and reserved it."""
        stream, pipeline, route = self.stream, self.pipeline, self.route
        if stream.committed:
            return
        stream.committed = True
        if shared:
            pipeline.recorder.count(route, verdict)
            stream.hold = held
        else:
            stream.hold = pipeline.recorder.record(route, verdict, self.facts)
            share_hold(pipeline, route, stream.hold)
        if verdict.features is not None:  # its TPOT target and its prompt (admission: slo)
            pipeline.views.slo.admitted(stream.hold, self.facts.slo, verdict.features.input_tokens)
        self.queue.count_started(route, self.facts, stream, verdict)

    def _offer(self, verdict: BodyVerdict) -> Waiter | BodyVerdict:
        """Queue a memory refusal (committed by the queue when it is judged again), or the
        queue's own refusal."""
        return self.queue.offer(
            self.pipeline, self.route, self.facts, self.stream, verdict, commit=self.commit
        )

    # --- the headers ---------------------------------------------------------------------

    async def on_headers(
        self,
        headers: Iterable[tuple[str, bytes]],
        end_of_stream: bool,
        subset: frozenset[str] | None = None,
        vouched: Vouched = NOTHING_VOUCHED,
    ) -> AsyncIterator[Step]:
        """The headers' steps (``Extend`` while a coarse refusal waits in the queue), then
        their answer. ``vouched``: what Envoy vouches for (``ext_proc.admit.identity``)."""
        pipeline, route = self.pipeline, self.route
        facts = self.facts = pipeline.on_headers(route, headers, end_of_stream, subset, vouched)
        if facts.answer is not None:
            yield Immediate(facts.answer)
            return
        if facts.skip_body:
            yield SkipBody()
            return
        promised = facts.content_length
        if facts.adapter is not None and promised is not None:
            lane: Lane = "helper" if self._helper_size(promised) else "inline"
            admitted = self.backlog.admit(promised, lane)
            if isinstance(admitted, str):  # busy: the coarse verdict, without the body
                verdict = self._coarse(promised, admitted)
                if queueable(route, verdict):
                    got = self._offer(verdict)
                    if isinstance(got, Waiter):
                        yield Extend(got.spec.max_queue_wait_ms)
                        got = await self.queue.wait(got)
                    verdict = got
                self.commit(verdict)
                outcome = with_profile(verdict.outcome, route, facts)
                self._watch(verdict)
                watch = self.stream.need_tokens is not None and self.watching()
                yield Coarse(outcome, watch)
                return
            self.stream.ticket = admitted
            telemetry.BACKLOG_BYTES.set(self.backlog.inflight_bytes)
        yield Proceed(facts.adapter is not None and self.watching())

    def _helper_size(self, nbytes: int) -> bool:
        return self.helper is not None and self.pipeline.needs_helper_size(nbytes)

    def watching(self) -> bool:
        """Ask for this request's response headers (``ext_proc.admit.overload_answer``); a
        fault reading the pool asks (the response phase fails open), it never fails the
        request."""
        if not overload_answer.watches(self.route.profile):
            return False
        try:
            return overload_answer.strained(self.pipeline, self.route)
        except Exception:
            return True

    def _watch(self, verdict: BodyVerdict | None) -> None:
        """What the response phase needs of a verdict: the request's need, when it goes on
        and its profile watches for a backend's overload 503."""
        if overload_answer.watches(self.route.profile):
            self.stream.need_tokens = overload_answer.need_tokens(self.route.profile, verdict)

    # --- the body ------------------------------------------------------------------------

    async def on_body(self, data: bytes, clock: BodyClock) -> AsyncIterator[Step]:
        """The body's steps (module docstring), then its answer, last. ``clock``: when the
        body arrived, and when Envoy's timer for it started as near as ICE can know
        (``ext_proc.admit.backlog.timer_started``): no lane answers after that timer's
        deadline less the answer's margin."""
        pipeline, route, facts, stream = self.pipeline, self.route, self.facts, self.stream
        verdict = await self._judge(data, clock)
        verdict = self.queue.behind_critical(route, facts, verdict)
        if verdict is not None and verdict.pending is not None:
            # Truncation waits on the embedding worker: ask Envoy for the time first.
            spec = route.profile.truncation
            yield Extend(spec.deadline_ms if spec is not None else 0)
            verdict = await finish_truncation(pipeline, route, facts, verdict)
        elif queueable(route, verdict):
            assert verdict is not None
            got = self._offer(verdict)
            if isinstance(got, Waiter):  # judged in time: its bytes leave the backlog;
                stream.answered()  # Envoy is asked for the wait
                stream.let_ticket_go()
                yield Extend(got.spec.max_queue_wait_ms)
                verdict = await self.queue.wait(got)  # committed by the queue
            else:
                verdict = got
        if verdict is None or verdict is GONE:
            step: Step = Untouched()
        else:
            if self._shares() and not stream.committed:
                verdict, hold = await admit_shared(pipeline, route, facts, stream, verdict)
                self.commit(verdict, held=hold, shared=True)
            self.commit(verdict)
            self._watch(verdict)
            step = Judged(with_profile(verdict.outcome, route, facts))
        self.recount(route, facts, verdict, stream.hold, data)
        if verdict is not GONE:
            stream.answered()
        stream.let_ticket_go()
        yield step

    def _shares(self) -> bool:
        """Verdicts are reserved in the replicas' shared ledger (``admit.shared_ledger``)."""
        remote = self.pipeline.views.remote
        return remote is not None and remote.active

    async def _judge(self, data: bytes, clock: BodyClock) -> BodyVerdict | None:
        """The body's verdict: in full (in-process or in the helper), from its size when it
        arrived too late to be read in time, None for a body that is not judged, or ``GONE``
        (continue untouched, uncounted) when Envoy can no longer hear it. A long body's
        receipt, its scan and its judgement each take their own turn of the loop."""
        pipeline, facts = self.pipeline, self.facts
        started = clock.arrived_s
        if len(data) > SMALL_BODY_BYTES:
            await asyncio.sleep(0)
        heavy: Weight = ""  # truthy: the helper lane ("size": tried in-process first)
        if self.helper is not None and facts.adapter is not None:
            heavy = self.helper.weigh(pipeline, data)
        lane: Lane = "helper" if heavy else "inline"
        if (
            self.stream.ticket is None
            and facts.adapter is not None
            and facts.content_length is None
        ):
            coarse = self._admit_at_body(len(data), lane)
            if coarse is not None:  # busy: judged from its size, now known
                return coarse
        ticket = self.stream.ticket
        if ticket is None:  # not admitted at the headers (an unknown path's body, tests)
            if heavy and self.helper is not None:
                return await self.helper.on_body(pipeline, self.route, facts, data, heavy)
            return pipeline.on_body(self.route, facts, data)
        backlog = self.backlog
        backlog.arrived(ticket, len(data), lane)
        alone = backlog.queued_bytes[lane] == ticket.nbytes
        if heavy or len(data) <= SMALL_BODY_BYTES:
            verdict = await self._judged_in_time(ticket, data, heavy, clock, alone=alone)
        else:  # one long body per turn of the event loop: what is ready (headers) goes first
            async with self.gate:
                await asyncio.sleep(0)  # also where a stream Envoy has closed is cancelled
                verdict = await self._judged_in_time(ticket, data, heavy, clock, alone=True)
        if verdict is not None and backlog.expired(time.perf_counter() - started):
            telemetry.BODIES_DROPPED.labels(reason="deadline").inc()
            log_dropped(self.rid, "its verdict came past Envoy's message timeout")
            backlog.lost()
            return GONE
        return verdict

    def _admit_at_body(self, nbytes: int, lane: Lane) -> BodyVerdict | None:
        """A chunked body's place in the backlog, asked for now that its size is known (at
        its headers it could have been anything up to ``max_body_bytes``); the coarse
        verdict on that size when the worker is busy (None: admitted, ``stream.ticket``)."""
        admitted = self.backlog.admit(nbytes, lane)
        if isinstance(admitted, str):
            return self._coarse(nbytes, admitted)
        self.stream.ticket = admitted
        telemetry.BACKLOG_BYTES.set(self.backlog.inflight_bytes)
        return None

    def _coarse(self, nbytes: int, why: str) -> BodyVerdict:
        """The coarse verdict on a body of ``nbytes`` (``Pipeline.on_size``), counted by why
        the body was not read (``ice_coarse_verdicts_total``)."""
        telemetry.COARSE_VERDICTS.labels(route=self.route.name, why=why).inc()
        return self.pipeline.on_size(self.route, self.facts, nbytes)

    async def _judged_in_time(
        self, ticket: Ticket, data: bytes, heavy: Weight, clock: BodyClock, *, alone: bool
    ) -> BodyVerdict | None:
        """The full verdict, or the coarse one when it could not come before Envoy's deadline
        (``clock``); the judge time feeds the lane's cost (``alone``: none was ahead of it)."""
        pipeline, route, facts = self.pipeline, self.route, self.facts
        # a body alone in the helper lane is tried (its wait ends by the deadline, below)
        if not (heavy and alone) and self.backlog.late_by(ticket, clock, time.perf_counter()):
            return self._coarse(len(data), "late")
        judging = time.perf_counter()
        if heavy and self.helper is not None:
            # the exact count's budget (from arrival) and Envoy's deadline: past either, the size
            budget = pipeline.policy.exact_count_budget_ms / 1000 - (judging - clock.arrived_s)
            left = self.backlog.answer_by(clock) - judging
            try:
                await asyncio.sleep(0)  # the scan took this turn; the helper's is the next
                verdict = await asyncio.wait_for(
                    self.helper.on_body(pipeline, route, facts, data, heavy),
                    max(0.0, min(budget, left)),
                )
            except TimeoutError:  # a count under way in the helper still finishes and teaches
                self.backlog.observe("helper", len(data), time.perf_counter() - judging)
                return self._coarse(len(data), "budget" if budget <= left else "late")
            if verdict is not None:  # the helper has no tenant ledger: the share is judged here
                verdict = recheck(
                    pipeline.policy, pipeline.views, pipeline.lookup, route, facts, verdict
                )
        else:
            verdict = pipeline.on_body(route, facts, data)
        if alone:  # with bodies ahead of it in the helper, the time includes their wait
            lane: Lane = "helper" if heavy else "inline"
            self.backlog.observe(lane, len(data), time.perf_counter() - judging)
        return verdict

    # --- the response --------------------------------------------------------------------

    def on_response_headers(
        self, headers: Iterable[tuple[str, bytes]], code_details: str | None
    ) -> Respond | None:
        """A backend's overload 503 becomes ICE's answer; None: the response goes on."""
        need = self.stream.need_tokens
        return overload_answer.respond(
            self.pipeline, self.route, self.facts, need, headers, code_details
        )
