"""Builders the test modules share (one home: no test module imports another).

``admission``: a stream's ``Admission`` over a pipeline and a queue, as the servicer builds
one, for tests that drive the queue or the shared ledger without gRPC; its ``commit`` is the
one that commits a verdict.
"""

from __future__ import annotations

import asyncio

from ext_proc.admit.admission import Admission
from ext_proc.admit.backlog import Backlog
from ext_proc.admit.pipeline import Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.stream import Stream


def admission(
    pipeline: Pipeline,
    route: Route,
    facts: RequestFacts,
    queue: AdmissionQueue,
    stream: Stream | None = None,
) -> Admission:
    """An ``Admission`` for one request whose headers gave ``facts``."""
    backlog = Backlog()
    got = Admission(
        pipeline=pipeline,
        helper=None,
        route=route,
        stream=stream or Stream(backlog, pipeline.views, queue),
        backlog=backlog,
        gate=asyncio.Lock(),
        queue=queue,
        recount=lambda *_args: None,
    )
    got.facts = facts
    return got
