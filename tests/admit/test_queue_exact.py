"""A request the estimate refused is counted exactly before it waits in the admission queue
(``ext_proc.admit.counting.exact_to_wait``): the queue judges it again as room comes, and at
the estimate's upper bound a short prompt would wait for room it does not need.

Hand-computed, blocks of 16 tokens, 40 output tokens, the tiny model's tokenizer (measured
factors 0.5 and 7.51; its widest token, 64 "#", stands for 16 estimated tokens): the body's
estimate is 151 tokens, so lo = ⌊(151 − 4 − 3) / (4 × 16)⌋ = 2 (the derived lower bound,
``ext_proc.tokencount.derived``) and hi = 912 (the body's byte bound); its exact count is
242. Blocks: lo ⌈42 / 16⌉ = 3, exact ⌈282 / 16⌉ = 18, hi ⌈952 / 16⌉ = 60. With 2 free blocks
both bounds are refused: the estimate decides (every count in between is refused too). With
30 free the exact request fits and hi does not.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from ext_proc.admit.backlog import Backlog
from ext_proc.admit.counting import H_TOKENS, exact_to_wait
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import AdmissionQueue, Waiter, queueable
from ext_proc.admit.stream import Stream
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import admission

DATA = Path(__file__).parents[1] / "data"
WORDS = " ".join(["alpha", "beta", "gamma", "delta"] * 25)
BODY = json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": WORDS}], "max_tokens": 40}
).encode()
POLICY = f"""
profiles:
  default:
    on_kv_shortfall: shed
    queue: {{enabled: true, max_queue_wait_ms: 59000, max_queue_length: 8, poll_ms: 59000}}
tokenizers:
  tiny: {{model_dir: {DATA / "vllm_cpu" / "tokenizer"}}}
exact_count: needed
exact_count_inline_bytes: %d
"""


def view(free: int) -> PoolSnapshot:
    """101 blocks of 16 (100 usable), ``free`` of them free."""
    b = BackendSignals(
        url="u",
        kv_cache_usage=1.0 - free / 100,
        num_requests_waiting=0,
        num_gpu_blocks=101,
        block_size=16,
    )
    return PoolSnapshot("default", (b,), time.monotonic())


class Rig:
    def __init__(self, inline_bytes: int = 65536) -> None:
        self.view = view(2)
        self.pipeline = Pipeline(parse_policy(POLICY % inline_bytes), lambda _: self.view)
        self.route = self.pipeline.router.resolve([])
        self.queue = AdmissionQueue()

    def offer(self) -> Waiter:
        facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")  # type: ignore[arg-type]
        first = self.pipeline.on_body(self.route, facts, BODY)
        assert first is not None and first.features is not None
        assert first.decision is not None and first.decision.reason == "kv_exhausted"
        assert first.features.input_tokens == 912  # decided by the estimate, at hi
        assert dict(first.outcome.headers)[H_TOKENS] == "estimate"
        assert queueable(self.route, first)
        stream = Stream(Backlog(), self.pipeline.views, self.queue)
        commit = admission(self.pipeline, self.route, facts, self.queue, stream).commit
        got = self.queue.offer(self.pipeline, self.route, facts, stream, first, commit=commit)
        assert isinstance(got, Waiter)
        return got


def test_a_request_the_estimate_refused_waits_with_its_exact_count() -> None:
    async def run() -> None:
        rig = Rig()
        w = rig.offer()
        assert w.first.features is not None and w.first.features.input_tokens == 242
        assert w.first.features.input_tokens_source == "exact"
        assert [v for k, v in w.first.outcome.headers if k == H_TOKENS] == ["exact"]
        rig.view = view(30)  # room for the exact 18 blocks, not for hi's 60
        rig.queue.tick()
        verdict = w.future.result()
        assert verdict.decision is not None and verdict.decision.decision == "pass"
        assert [v for k, v in verdict.outcome.headers if k == H_TOKENS] == ["exact"]
        assert rig.pipeline.views.held(rig.view) == 18  # held at the exact count

    asyncio.run(run())


def test_a_body_over_the_inline_limit_waits_with_the_estimate() -> None:
    async def run() -> None:
        rig = Rig(inline_bytes=len(BODY) - 1)  # its count belongs in the helper process
        w = rig.offer()
        assert w.first.features is not None and w.first.features.input_tokens == 912
        rig.view = view(30)
        rig.queue.tick()
        assert not w.future.done()  # 60 blocks at hi: still no room
        w.future.cancel()

    asyncio.run(run())


def test_an_exactly_counted_or_bodiless_verdict_is_left_as_it_is() -> None:
    rig = Rig()
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")  # type: ignore[arg-type]
    first = rig.pipeline.on_body(rig.route, facts, BODY)
    assert first is not None
    counters, inline = rig.pipeline.counters, rig.pipeline.policy.exact_count_inline_bytes
    once = exact_to_wait(counters, inline, first)
    assert exact_to_wait(counters, inline, once) is once  # already exact
    assert exact_to_wait(None, inline, first) is first  # no tokenizer
    bodiless = first.__class__(first.decision, first.features, first.outcome)
    assert exact_to_wait(counters, inline, bodiless) is bodiless  # a coarse verdict
