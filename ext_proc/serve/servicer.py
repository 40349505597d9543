"""The gRPC shell: one ext_proc ``Process`` stream per HTTP request.

Envoy sends the request headers, then (for JSON inference requests) the buffered body, and,
for a request ICE sent on with its response headers asked for
(``ext_proc.admit.overload_answer``), the response headers; ICE answers each message exactly
once. Any fault inside ICE is caught per message: with the route's ``fail_mode: open`` the
request continues untouched, with ``closed`` it gets a 503 in the API's format; in the
response phase the response always continues as it was.

Protocol state (which message we are at) stays here; the request's facts are
``RequestFacts`` (immutable, from the headers phase) and what the stream holds (its backlog
ticket, KV hold, queue slot) is its ``ext_proc.admit.stream.Stream``, released in one place
when the stream ends. The body phase's ways to a verdict, in order: judged in full (here or
in the helper process) or from its size (``_judge``); a pending truncation finished
(``ext_proc.admit.truncation``); a memory refusal queued (``ext_proc.admit.queue``); a
verdict reserved in the replicas' shared ledger (``ext_proc.admit.shared_ledger``). A body
with a ``content-length`` is promised its place in the worker's backlog at the headers (a
busy worker judges it there, from that size: the coarse verdict, which may wait in the
queue too); a chunked one is admitted at its body phase, by its size (``_admit_at_body``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ext_proc import telemetry
from ext_proc.admit import overload_answer
from ext_proc.admit.backlog import SMALL_BODY_BYTES, Backlog, BodyClock, Lane, Ticket
from ext_proc.admit.faults import JudgeFault
from ext_proc.admit.outcome import Continue, Outcome, priority_fields, reject_outcome
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue, Waiter, queueable
from ext_proc.admit.shared_ledger import admit_shared, share_hold
from ext_proc.admit.stream import Stream
from ext_proc.admit.truncation import finish_truncation
from ext_proc.schemas import OPENAI_CHAT_FALLBACK
from ext_proc.serve import render
from ext_proc.serve.helper import Late, Offload, Weight, judge_within, weigh
from ext_proc.serve.memtrim import Trimmer
from ext_proc.serve.messages import (
    code_details,
    continue_phase,
    extend_timeout,
    log_dropped,
    request_id,
    subset_hint,
)
from ext_proc.serve.recount import Recounter

__all__ = ["ExtProcServicer"]

log = logging.getLogger("ice.servicer")

Replies = AsyncIterator[pb.ProcessingResponse]


def _with_profile(outcome: Outcome, route: Route, facts: RequestFacts) -> Outcome:
    """The access log's ``profile`` and priority fields: the profile the request was judged
    under, its priority, and a priority header's claim ICE did not take."""
    fields = (
        ("profile", route.profile.name),
        *priority_fields(facts.priority, facts.priority_claimed),
    )
    return dataclasses.replace(outcome, log=(*outcome.log, *fields))


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Answers Envoy's ext_proc streams with the pipeline's verdicts."""

    def __init__(
        self,
        pipeline: Pipeline,
        offload: Offload | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.offload = offload
        self.backlog = backlog or Backlog()
        self.trimmer = Trimmer(lambda: self.backlog.idle)
        self._gate = asyncio.Lock()  # long bodies judged in-process: one at a time
        self.queue = AdmissionQueue()  # shared by every stream of the worker
        self.recounter = Recounter()  # holds at the estimate's bound, counted after the answer
        self._logged: set[str] = set()
        self._rid = ""  # the stream's x-request-id (set on each stream's own view)

    def swap(self, pipeline: Pipeline, offload: Offload | None) -> None:
        """A reloaded policy: streams that start from now on use ``pipeline``; a stream
        already open keeps the one it started with (never a mix of two policies)."""
        self.pipeline, self.offload = pipeline, offload

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> Replies:
        # The stream's own view of the servicer: the pipeline and offload in force when it
        # opened (``swap``), the shared backlog, gate, queue and trimmer.
        view = copy.copy(self)
        route = view.pipeline.router.resolve(context.invocation_metadata() or ())
        stream = Stream(view.backlog, view.pipeline.views, view.queue, self._released)
        try:
            async for response in view._process(request_iterator, route, stream):
                yield response
        except asyncio.CancelledError:  # Envoy closed the stream (its message timeout)
            if stream.abandoned():  # an admitted body Envoy gave up on: admit less
                log_dropped(view._rid, "Envoy closed its stream before ICE answered its body")
            raise
        finally:
            stream.close()  # the request is over: its ticket, blocks and slot are free

    def _released(self, ticket: Ticket) -> None:
        if ticket.received:
            self.trimmer.seen(ticket.nbytes)

    async def _process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], route: Route, stream: Stream
    ) -> Replies:
        facts = RequestFacts(priority=route.default_priority)
        answered = 0.0  # when ICE handed gRPC its answer to the headers (perf_counter)
        async for request in request_iterator:
            started = time.perf_counter()
            phase = request.WhichOneof("request")
            try:
                if phase == "request_headers":
                    self._rid = request_id(request.request_headers)  # for the logs
                    subset = subset_hint(request.metadata_context)
                    facts, got = self._headers(route, stream, request.request_headers, subset)
                    if isinstance(got, Waiter):  # a coarse refusal waits in the queue
                        yield extend_timeout(got.spec.max_queue_wait_ms)
                        got = await self._coarse_waited(route, facts, stream, got)
                    response = got
                elif phase == "request_body":
                    response = None
                    data = request.request_body.body
                    clock = self.backlog.clock(answered, started, len(data))
                    async for reply in self._body(route, facts, stream, data, clock):
                        if reply.HasField("override_message_timeout"):
                            yield reply  # at once: Envoy waits longer (it is not the answer)
                        else:
                            response = reply
                    assert response is not None
                elif phase == "response_headers":
                    response = self._response_headers(route, facts, stream, request)
                else:
                    response = continue_phase(phase)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                response = self._fault(route, facts, phase, e, self._rid)
            telemetry.PROCESSING_SECONDS.labels(phase=phase or "unknown").observe(
                time.perf_counter() - started
            )
            if phase == "request_headers":
                answered = time.perf_counter()  # Envoy sends the body after this answer
            yield response

    async def _body(
        self, route: Route, facts: RequestFacts, stream: Stream, data: bytes, clock: BodyClock
    ) -> Replies:
        """The body phase: timeout extensions while ICE waits (truncation's embeddings, the
        admission queue), then the answer, last. ``clock``: when the body arrived, and when
        Envoy's timer for it started as near as ICE can know (``backlog.timer_started``)."""
        verdict = await self._judge(route, facts, stream, data, clock)
        verdict = self.queue.behind_critical(route, facts, verdict)
        recorded = False
        if verdict is not None and verdict.pending is not None:
            # Truncation waits on the embedding worker: ask Envoy for the time first (a
            # reply with only override_message_timeout is not the answer).
            spec = route.profile.truncation
            yield extend_timeout(spec.deadline_ms if spec is not None else 0)
            verdict = await finish_truncation(self.pipeline, route, facts, verdict)
        elif queueable(route, verdict):
            assert verdict is not None
            got = self.queue.offer(self.pipeline, route, facts, stream, verdict)
            if isinstance(got, Waiter):  # judged in time: its bytes leave the backlog;
                stream.answered()  # Envoy is asked for the wait
                stream.let_ticket_go()
                yield extend_timeout(got.spec.max_queue_wait_ms)
                verdict = await self.queue.wait(got)
                recorded = True
                share_hold(self.pipeline, route, stream.hold)
            else:
                verdict = got
        if not recorded and self._shares(verdict):
            assert verdict is not None
            verdict = await admit_shared(self.pipeline, route, facts, stream, verdict)
            self.queue.count_started(route, facts, stream, verdict)
            recorded = True  # counted and held
        response = self._body_response(route, facts, stream, verdict, recorded)
        self.recounter.later(self.pipeline, self.offload, route, facts, verdict, stream.hold, data)
        if verdict is not _GONE:
            stream.answered()
        stream.let_ticket_go()
        yield response

    def _shares(self, verdict: BodyVerdict | None) -> bool:
        """The verdict is reserved in the replicas' shared ledger (``admit.shared_ledger``)."""
        remote = self.pipeline.views.remote
        return remote is not None and remote.active and verdict is not None and verdict is not _GONE

    def _headers(
        self,
        route: Route,
        stream: Stream,
        headers: pb.HttpHeaders,
        subset: frozenset[str] | None = None,
    ) -> tuple[RequestFacts, pb.ProcessingResponse | Waiter]:
        """The headers' answer; a ``Waiter`` when a coarse refusal waits in the queue. A
        body with a ``content-length`` is promised a place in the backlog here; a chunked
        one is admitted at the body phase, by its size (``_admit_at_body``)."""
        pairs = ((h.key, h.raw_value or h.value.encode()) for h in headers.headers.headers)
        facts = self.pipeline.on_headers(route, pairs, headers.end_of_stream, subset)
        if facts.answer is not None:
            return facts, render.render_immediate(facts.answer)
        if facts.skip_body:
            return facts, render.skip_body(facts.strip, facts.shadow_headers)
        promised = facts.content_length
        if facts.adapter is not None and promised is not None:
            helper = self.offload is not None and self.pipeline.needs_helper_size(promised)
            admitted = self.backlog.admit(promised, "helper" if helper else "inline")
            if isinstance(admitted, str):  # busy: the coarse verdict, without the body
                return facts, self._coarse(route, facts, stream, promised, admitted)
            stream.ticket = admitted
            telemetry.BACKLOG_BYTES.set(self.backlog.inflight_bytes)
        watch = facts.adapter is not None and self._watching(route)
        return facts, render.headers_continue(facts.strip, watch=watch)

    def _coarse(
        self, route: Route, facts: RequestFacts, stream: Stream, promised: int, why: str
    ) -> pb.ProcessingResponse | Waiter:
        """The coarse verdict at the headers (the worker is busy), recorded and held; a
        memory refusal on a route with a queue waits in it (``_coarse_waited``)."""
        verdict = self.pipeline.on_size(route, facts, promised)
        telemetry.COARSE_VERDICTS.labels(route=route.name, why=why).inc()
        if queueable(route, verdict):
            got = self.queue.offer(self.pipeline, route, facts, stream, verdict)
            if isinstance(got, Waiter):
                return got
            verdict = got
        return self._coarse_answer(route, facts, stream, verdict, recorded=False)

    async def _coarse_waited(
        self, route: Route, facts: RequestFacts, stream: Stream, waiter: Waiter
    ) -> pb.ProcessingResponse:
        """A queued coarse verdict's answer, once the queue judged it again (recorded)."""
        verdict = await self.queue.wait(waiter)
        share_hold(self.pipeline, route, stream.hold)
        return self._coarse_answer(route, facts, stream, verdict, recorded=True)

    def _coarse_answer(
        self,
        route: Route,
        facts: RequestFacts,
        stream: Stream,
        verdict: BodyVerdict,
        recorded: bool,
    ) -> pb.ProcessingResponse:
        if not recorded:
            stream.hold = self.pipeline.record(route, verdict)
            share_hold(self.pipeline, route, stream.hold)
            self.queue.count_started(route, facts, stream, verdict)
        outcome = _with_profile(verdict.outcome, route, facts)
        self._watch(route, stream, verdict)
        watch = stream.need_tokens is not None and self._watching(route)
        return render.headers_outcome(outcome, facts.strip, watch=watch)

    def _watching(self, route: Route) -> bool:
        """Ask for this request's response headers (``ext_proc.admit.overload_answer``); a
        fault reading the pool asks (the response phase fails open), it never fails the
        request."""
        if not overload_answer.watches(route.profile):
            return False
        try:
            return overload_answer.strained(self.pipeline, route)
        except Exception:
            return True

    @staticmethod
    def _watch(route: Route, stream: Stream, verdict: BodyVerdict | None) -> None:
        """What the response phase needs of a verdict: the request's need, when it goes on
        and its profile watches for a backend's overload 503."""
        if overload_answer.watches(route.profile):
            stream.need_tokens = overload_answer.need_tokens(route.profile, verdict)

    def _response_headers(
        self, route: Route, facts: RequestFacts, stream: Stream, request: pb.ProcessingRequest
    ) -> pb.ProcessingResponse:
        """A backend's overload 503 becomes ICE's answer; any other response goes on."""
        headers = request.response_headers.headers.headers
        pairs = ((h.key, h.raw_value or h.value.encode()) for h in headers)
        details = code_details(request)
        need = stream.need_tokens
        got = overload_answer.respond(self.pipeline, route, facts, need, pairs, details)
        if got is None:
            return render.response_headers_continue()
        return render.render_immediate(got, overload_answer.DETAILS)

    async def _judge(
        self, route: Route, facts: RequestFacts, stream: Stream, data: bytes, clock: BodyClock
    ) -> BodyVerdict | None:
        """The body's verdict: in full (in-process or in the offload helper), from its size
        when it arrived too late to be read in time, None for a body that is not judged, or
        ``_GONE`` (continue untouched, uncounted) when Envoy can no longer hear it. A long
        body's receipt, its scan and its judgement each take their own turn of the loop."""
        started = clock.arrived_s
        if len(data) > SMALL_BODY_BYTES:
            await asyncio.sleep(0)
        heavy: Weight = ""  # truthy: the helper lane ("size": tried in-process first)
        if self.offload is not None and facts.adapter is not None:
            heavy = weigh(self.offload, self.pipeline, data)
        lane: Lane = "helper" if heavy else "inline"
        if stream.ticket is None and facts.adapter is not None and facts.content_length is None:
            admitted = self._admit_at_body(route, facts, stream, len(data), lane)
            if admitted is not None:  # busy: judged from its size, now known
                return admitted
        ticket = stream.ticket
        if ticket is None:  # not admitted at the headers (an unknown path's body, tests)
            if heavy and self.offload is not None:
                return await self.offload.on_body(self.pipeline, route, facts, data, heavy)
            return self.pipeline.on_body(route, facts, data)
        backlog = self.backlog
        backlog.arrived(ticket, len(data), lane)
        alone = backlog.queued_bytes[lane] == ticket.nbytes
        if heavy or len(data) <= SMALL_BODY_BYTES:
            verdict = await self._judged_in_time(route, facts, ticket, data, heavy, clock, alone)
        else:  # one long body per turn of the event loop: what is ready (headers) goes first
            async with self._gate:
                await asyncio.sleep(0)  # also where a stream Envoy has closed is cancelled
                verdict = await self._judged_in_time(route, facts, ticket, data, heavy, clock, True)
        if verdict is not None and backlog.expired(time.perf_counter() - started):
            telemetry.BODIES_DROPPED.labels(reason="deadline").inc()
            log_dropped(self._rid, "its verdict came past Envoy's message timeout")
            backlog.lost()
            return _GONE
        return verdict

    def _admit_at_body(
        self, route: Route, facts: RequestFacts, stream: Stream, nbytes: int, lane: Lane
    ) -> BodyVerdict | None:
        """A chunked body's place in the backlog, asked for now that its size is known (at
        its headers it could have been anything up to ``max_body_bytes``); the coarse
        verdict on that size when the worker is busy (None: admitted, ``stream.ticket``)."""
        admitted = self.backlog.admit(nbytes, lane)
        if isinstance(admitted, str):
            telemetry.COARSE_VERDICTS.labels(route=route.name, why=admitted).inc()
            return self.pipeline.on_size(route, facts, nbytes)
        stream.ticket = admitted
        telemetry.BACKLOG_BYTES.set(self.backlog.inflight_bytes)
        return None

    async def _judged_in_time(
        self,
        route: Route,
        facts: RequestFacts,
        ticket: Ticket,
        data: bytes,
        heavy: Weight,
        clock: BodyClock,
        alone: bool,
    ) -> BodyVerdict | None:
        """The full verdict, or the coarse one when it could not come before Envoy's deadline
        (``clock``); the judge time feeds the lane's cost (``alone``: none was ahead of it)."""
        # a body alone in the helper lane is tried (its wait ends by the deadline, below)
        if not (heavy and alone) and self.backlog.late_by(ticket, clock, time.perf_counter()):
            telemetry.COARSE_VERDICTS.labels(route=route.name, why="late").inc()
            return self.pipeline.on_size(route, facts, len(data))
        judging = time.perf_counter()
        if heavy and self.offload is not None:
            # the exact count's budget (from arrival) and Envoy's deadline: past either, the size
            budget = self.pipeline.policy.exact_count_budget_ms / 1000 - (judging - clock.arrived_s)
            left = self.backlog.answer_by(clock) - judging
            got = await judge_within(
                self.offload, self.pipeline, route, facts, data, heavy, min(budget, left)
            )
            if isinstance(got, Late):
                why = "budget" if budget <= left else "late"
                telemetry.COARSE_VERDICTS.labels(route=route.name, why=why).inc()
                self.backlog.observe("helper", len(data), time.perf_counter() - judging)
                return self.pipeline.on_size(route, facts, len(data))
            verdict = got
        else:
            verdict = self.pipeline.on_body(route, facts, data)
        if alone:  # with bodies ahead of it in the helper, the time includes their wait
            lane: Lane = "helper" if heavy else "inline"
            self.backlog.observe(lane, len(data), time.perf_counter() - judging)
        return verdict

    def _body_response(
        self,
        route: Route,
        facts: RequestFacts,
        stream: Stream,
        verdict: BodyVerdict | None,
        recorded: bool,
    ) -> pb.ProcessingResponse:
        """``recorded``: the admission queue (or the shared ledger) counted the verdict."""
        if verdict is None or verdict is _GONE:
            return render.body_continue()
        if not recorded:
            stream.hold = self.pipeline.record(route, verdict)
            self.queue.count_started(route, facts, stream, verdict)  # a tenant's in flight
        self._watch(route, stream, verdict)
        return render.render_body_outcome(_with_profile(verdict.outcome, route, facts))

    def _fault(
        self, route: Route, facts: RequestFacts, phase: str | None, error: Exception, rid: str
    ) -> pb.ProcessingResponse:
        """ICE's fault: the request phases fail as the profile says, the response phase open;
        a body's is counted by stage (a ``JudgeFault``'s, or ``admit``: after the verdict);
        each kind is logged once, with the request id."""
        judging = phase in ("request_headers", "request_body")
        mode = route.profile.fail_mode if judging else "open"
        telemetry.ERRORS.labels(phase=phase or "unknown", fail_mode=mode).inc()
        kind, where = type(error).__name__, ""
        if phase == "request_body":
            stage = error.stage if isinstance(error, JudgeFault) else "admit"
            kind = error.kind if isinstance(error, JudgeFault) else kind
            telemetry.JUDGE_ERRORS.labels(route=route.name, stage=stage).inc()
            where = f" at stage {stage}"
        key = f"{phase}{where}:{kind}"
        if key not in self._logged:
            self._logged.add(key)
            rid = rid or "without x-request-id"
            log.exception(
                "internal error in phase %s%s (failing %s; request %s)", phase, where, mode, rid
            )
        if mode == "closed":
            adapter = facts.adapter or OPENAI_CHAT_FALLBACK
            return render.render_immediate(
                reject_outcome(
                    adapter, 503, "ice_internal_error", "ICE could not judge the request."
                )
            )
        return continue_phase(phase)


# The verdict of a body Envoy has given up on: answered with a plain continue, not counted.
_GONE = BodyVerdict(None, None, Continue([], None))
