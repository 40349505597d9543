"""The gRPC shell: one ext_proc ``Process`` stream per HTTP request.

Envoy sends the request headers, then (for JSON inference requests) the buffered body, and,
for a request ICE sent on with its response headers asked for
(``ext_proc.admit.overload_answer``), the response headers; ICE answers each message exactly
once. This module only turns each message into a call on the stream's
``ext_proc.admit.admission.Admission`` and each step it yields into a message (``Extend``:
a message-timeout extension, sent at once; the last step: the answer). Any fault inside ICE
is caught per message: with the route's ``fail_mode: open`` the request continues
untouched, with ``closed`` it gets a 503 in the API's format; in the response phase the
response always continues as it was.

Protocol state (which message we are at) stays here; the request's facts and its way to a
verdict are the ``Admission``'s, and what the stream holds (its backlog ticket, KV hold,
queue slot) is its ``ext_proc.admit.stream.Stream``, released in one place when the stream
ends. A stream keeps the pipeline and helper in force when it opened (``swap``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ext_proc import telemetry
from ext_proc.admit import overload_answer
from ext_proc.admit.admission import (
    Admission,
    Coarse,
    Extend,
    Immediate,
    Judged,
    Proceed,
    SkipBody,
    Step,
    Untouched,
    log_dropped,
)
from ext_proc.admit.backlog import Backlog, Ticket
from ext_proc.admit.faults import JudgeFault
from ext_proc.admit.outcome import reject_outcome
from ext_proc.admit.pipeline import Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.stream import Stream
from ext_proc.schemas import OPENAI_CHAT_FALLBACK
from ext_proc.serve import render
from ext_proc.serve.memtrim import Trimmer
from ext_proc.serve.messages import (
    code_details,
    continue_phase,
    extend_timeout,
    request_id,
    subset_hint,
    vouched,
)
from ext_proc.serve.offload import Offload
from ext_proc.serve.recount import Recounter

__all__ = ["ExtProcServicer", "message_for"]

log = logging.getLogger("ice.servicer")

Replies = AsyncIterator[pb.ProcessingResponse]


def message_for(step: Step, facts: RequestFacts) -> pb.ProcessingResponse:
    """The ext_proc message that carries out ``step``."""
    if isinstance(step, Extend):
        return extend_timeout(step.ms)
    if isinstance(step, Immediate):
        return render.render_immediate(step.respond)
    if isinstance(step, SkipBody):
        return render.skip_body(facts.strip, facts.shadow_headers)
    if isinstance(step, Proceed):
        return render.headers_continue(facts.strip, watch=step.watch)
    if isinstance(step, Coarse):
        return render.headers_outcome(step.outcome, facts.strip, watch=step.watch)
    if isinstance(step, Judged):
        return render.render_body_outcome(step.outcome)
    assert isinstance(step, Untouched)
    return render.body_continue()


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

    def swap(self, pipeline: Pipeline, offload: Offload | None) -> None:
        """A reloaded policy: streams that start from now on use ``pipeline``; a stream
        already open keeps the one it started with (never a mix of two policies)."""
        self.pipeline, self.offload = pipeline, offload

    def admission(self, route: Route) -> Admission:
        """A new stream's way to its verdict: the pipeline and helper in force now, the
        worker's backlog, gate, queue and recounter."""
        pipeline, offload, recounter = self.pipeline, self.offload, self.recounter
        stream = Stream(self.backlog, pipeline.views, self.queue, self._released)
        return Admission(
            pipeline=pipeline,
            helper=offload,
            route=route,
            stream=stream,
            backlog=self.backlog,
            gate=self._gate,
            queue=self.queue,
            recount=lambda *args: recounter.later(pipeline, offload, *args),
        )

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> Replies:
        route = self.pipeline.router.resolve(context.invocation_metadata() or ())
        admission = self.admission(route)
        try:
            async for response in self._process(request_iterator, admission):
                yield response
        except asyncio.CancelledError:  # Envoy closed the stream (its message timeout)
            if admission.stream.abandoned():  # an admitted body Envoy gave up on: admit less
                log_dropped(admission.rid, "Envoy closed its stream before ICE answered its body")
            raise
        finally:
            admission.stream.close()  # the request is over: its ticket, blocks and slot free

    def _released(self, ticket: Ticket) -> None:
        if ticket.received:
            self.trimmer.seen(ticket.nbytes)

    async def _process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], admission: Admission
    ) -> Replies:
        answered = 0.0  # when ICE handed gRPC its answer to the headers (perf_counter)
        async for request in request_iterator:
            started = time.perf_counter()
            phase = request.WhichOneof("request")
            response: pb.ProcessingResponse | None = None
            try:
                steps: AsyncIterator[Step] | None = None
                if phase == "request_headers":
                    headers = request.request_headers
                    admission.rid = request_id(headers)  # for the logs
                    pairs = (
                        (h.key, h.raw_value or h.value.encode()) for h in headers.headers.headers
                    )
                    subset = subset_hint(request.metadata_context)
                    steps = admission.on_headers(
                        pairs, headers.end_of_stream, subset, vouched(request)
                    )
                elif phase == "request_body":
                    data = request.request_body.body
                    clock = self.backlog.clock(answered, started, len(data))
                    steps = admission.on_body(data, clock)
                elif phase == "response_headers":
                    response = self._response_headers(admission, request)
                else:
                    response = continue_phase(phase)
                if steps is not None:
                    async for step in steps:
                        message = message_for(step, admission.facts)
                        if isinstance(step, Extend):
                            yield message  # at once: Envoy waits longer (it is not the answer)
                        else:
                            response = message
                    assert response is not None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                response = self._fault(admission.route, admission.facts, phase, e, admission.rid)
            telemetry.processing(phase or "unknown").observe(time.perf_counter() - started)
            if phase == "request_headers":
                answered = time.perf_counter()  # Envoy sends the body after this answer
            yield response

    @staticmethod
    def _response_headers(
        admission: Admission, request: pb.ProcessingRequest
    ) -> pb.ProcessingResponse:
        """A backend's overload 503 becomes ICE's answer; any other response goes on."""
        headers = request.response_headers.headers.headers
        pairs = ((h.key, h.raw_value or h.value.encode()) for h in headers)
        got = admission.on_response_headers(pairs, code_details(request))
        if got is None:
            return render.response_headers_continue()
        return render.render_immediate(got, overload_answer.DETAILS)

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
