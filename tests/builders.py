"""Builders the test modules share (one home: no test module imports another).

``admission``: a stream's ``Admission`` over a pipeline and a queue, as the servicer builds
one, for tests that drive the queue or the shared ledger without gRPC; its ``commit`` is the
one that commits a verdict. ``counting_pipeline``: a pipeline that counts with the tokenizer in
``folder`` under ``exact_count: mode``, on a calm pool.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ext_proc.admit.admission import Admission
from ext_proc.admit.backlog import Backlog
from ext_proc.admit.pipeline import Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.stream import Stream
from ext_proc.policy.load import parse_policy
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot


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


def counting_pipeline(folder: str | Path, max_model_len: int, mode: str) -> Pipeline:
    """A pipeline with the tokenizer in ``folder`` (``exact_count: mode``), no output buffer,
    against a calm backend of unknown size."""
    policy = parse_policy(
        f"""
profiles: {{default: {{max_model_len: {max_model_len}, output_buffer_tokens: 0,
                      min_output_tokens: 1}}}}
tokenizers:
  m: {{model_dir: {folder}}}
exact_count: {mode}
"""
    )
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    return Pipeline(policy, lambda _pool: snap)
