"""A hold taken at the estimate's upper bound shrinks to the exact count once the request has
its answer (``ext_proc.placement.holding.shrink``, ``ext_proc.serve.recount``).

Hand-computed: blocks = ⌈(prompt + output) / block_size⌉ per sequence under ``reserve`` (no
prefix-cache hit: the views carry no hit ratio). The streams are driven in-process through
``ExtProcServicer.Process`` and kept open while the hold is read, as Envoy keeps a stream
open until the response is over.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

from ext_proc import telemetry
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.verdict import RequestFacts
from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment, endpoint_key
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.evaluate import Shape
from ext_proc.policy.load import load_policy, parse_policy
from ext_proc.policy.settings import Policy, Profile
from ext_proc.schemas import BY_NAME
from ext_proc.serve.offload import Offload
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import FakeContext, body_msg, headers_msg

DATA = Path(__file__).parents[1] / "data"
BS = 16
POLICY_TEXT = f"""
profiles:
  default: {{max_model_len: 100000, output_buffer_tokens: 0, min_output_tokens: 1}}
  forecast: {{max_model_len: 100000, admission: forecast}}
tokenizers:
  tiny: {{model_dir: {DATA / "vllm_cpu" / "tokenizer"}}}
exact_count: needed
"""


def view(blocks: int = 100_001) -> PoolSnapshot:
    b = BackendSignals(
        url="u", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=blocks, block_size=BS
    )
    return PoolSnapshot(pool="default", backends=(b,), taken_at_s=time.monotonic())


def profile(policy: Policy, name: str = "default") -> Profile:
    return policy.profiles[name]


# --- PoolViews.shrink, hand-computed -----------------------------------------------------------


def test_shrink_gives_back_what_the_exact_count_does_not_need() -> None:
    policy = parse_policy(POLICY_TEXT)
    views, snap = PoolViews(), view()
    # held at a 1,000-token bound with 100 output tokens: ⌈1,100 / 16⌉ = 69 blocks
    hold = views.hold(profile(policy), snap, Shape.single(1000), 100)
    assert hold is not None and hold.blocks == 69
    assert views.live_total("default", "") == 69 and views.ledger(snap) == {"u": 69}
    # counted 200 exactly: ⌈300 / 16⌉ = 19 blocks; 50 given back, everywhere
    assert views.shrink(hold, profile(policy), snap, Shape.single(200), 100) == 50
    assert hold.blocks == 19
    assert views.live_total("default", "") == 19 and views.ledger(snap) == {"u": 19}
    assert hold.trajectory is not None and hold.trajectory.whole == 19
    assert hold.trajectory.prompt_blocks == math.ceil(200 / BS)
    views.release(hold)
    assert views.live_total("default", "") == 0


def test_shrink_never_grows_a_hold_and_ignores_a_released_one() -> None:
    policy = parse_policy(POLICY_TEXT)
    views, snap = PoolViews(), view()
    hold = views.hold(profile(policy), snap, Shape.single(1000), 100)
    assert hold is not None
    assert views.shrink(hold, profile(policy), snap, Shape.single(2000), 100) == 0
    assert hold.blocks == 69 and views.live_total("default", "") == 69
    views.release(hold)
    assert views.shrink(hold, profile(policy), snap, Shape.single(10), 100) == 0
    assert views.live_total("default", "") == 0  # not below zero, not touched


def test_shrink_moves_a_forecast_trajectory_to_its_exact_prompt() -> None:
    policy = parse_policy(POLICY_TEXT)
    views, snap = PoolViews(), view()
    fc = profile(policy, "forecast")
    hold = views.hold(fc, snap, Shape.single(1600), 64)
    assert hold is not None and hold.trajectory is not None
    # no history of output lengths: held at its limit, ⌈(1,600 + 64) / 16⌉ = 104 blocks
    assert hold.blocks == 104 and hold.trajectory.prompt_blocks == 100
    fit_before = views.room(fc, snap)
    assert views.shrink(hold, fc, snap, Shape.single(160), 64) == 104 - 14
    assert hold.trajectory.prompt_blocks == 10 and hold.blocks == 14  # ⌈224 / 16⌉
    fit_after = views.room(fc, snap)
    assert fit_before is not None and fit_after is not None
    assert fit_after.free_blocks == fit_before.free_blocks + 90  # the peak fell by 90


def test_shrink_rewrites_the_live_total_the_other_workers_read() -> None:
    policy = parse_policy(POLICY_TEXT)
    with (
        LedgerSegment(2, ring_entries=64) as seg,
        LedgerHandle(seg.name, 0) as mine,
        LedgerHandle(seg.name, 1) as other,
    ):
        views, snap = PoolViews(shared=mine), view()
        hold = views.hold(profile(policy), snap, Shape.single(1000), 100)
        assert hold is not None
        key = endpoint_key("default", "")
        assert other.others_live() == {key: 69}
        views.shrink(hold, profile(policy), snap, Shape.single(200), 100)
        assert other.others_live() == {key: 19}


# --- through the servicer: the recount after the answer ----------------------------------------


def chat(content: str, max_tokens: int = 8) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
    return json.dumps({**body, "max_tokens": max_tokens}).encode()


def exact_tokens(pipeline: Pipeline, body: bytes) -> int:
    facts = RequestFacts(adapter=BY_NAME["openai.chat"])
    return pipeline.exact_features(pipeline.router.resolve(()), facts, body).input_tokens


def recounts(outcome: str) -> float:
    value = telemetry.HOLD_RECOUNTS.labels(outcome=outcome)._value.get()
    return float(value)


def hold_through_servicer(
    servicer: ExtProcServicer, body: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> tuple[list[str], int, int]:
    """Send ``body`` on one stream; return the headers ICE answered with, the live hold
    right after the answer and the hold once the recounts are done (the stream still open)."""
    got: list[str] = []
    out: dict[str, int] = {}

    async def go() -> None:
        done = asyncio.Event()

        async def requests() -> AsyncIterator[object]:
            yield headers_msg()
            yield body_msg(body)
            await done.wait()  # Envoy keeps the stream open until the response ends

        stream = servicer.Process(requests(), FakeContext(metadata))
        async for r in stream:
            if r.WhichOneof("response") == "request_body":
                mutation = r.request_body.response.header_mutation
                got.extend(
                    f"{h.header.key}={h.header.raw_value.decode()}" for h in mutation.set_headers
                )
                out["answered"] = servicer.pipeline.views.live_total("default", "")
                await servicer.recounter.aclose()
                out["recounted"] = servicer.pipeline.views.live_total("default", "")
                done.set()

    asyncio.run(go())
    return got, out["answered"], out["recounted"]


def test_a_request_the_estimate_decided_is_held_at_its_exact_count_after_the_answer() -> None:
    policy = parse_policy(POLICY_TEXT)
    snap = view()
    pipeline = Pipeline(policy, lambda _pool: snap)
    body = chat("word " * 400)
    exact = exact_tokens(pipeline, body)
    shrunk = recounts("shrunk")
    headers, answered, recounted = hold_through_servicer(ExtProcServicer(pipeline), body)
    assert "x-ice-tokens=estimate" in headers
    assert answered > math.ceil((exact + 8) / BS)  # held at the bound when answered
    assert recounted == math.ceil((exact + 8) / BS)  # and at the exact count after
    assert recounts("shrunk") == shrunk + 1


def test_a_request_counted_exactly_is_not_counted_again() -> None:
    policy = parse_policy(POLICY_TEXT.replace("exact_count: needed", "exact_count: always"))
    snap = view()
    pipeline = Pipeline(policy, lambda _pool: snap)
    body = chat("word " * 400)
    before = sum(recounts(o) for o in ("shrunk", "unchanged", "failed", "skipped", "ended"))
    headers, answered, recounted = hold_through_servicer(ExtProcServicer(pipeline), body)
    assert "x-ice-tokens=exact" in headers
    assert answered == recounted == math.ceil((exact_tokens(pipeline, body) + 8) / BS)
    after = sum(recounts(o) for o in ("shrunk", "unchanged", "failed", "skipped", "ended"))
    assert after == before


def test_a_long_body_is_recounted_in_the_helper_process(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_TEXT)
    policy = load_policy(str(path))
    snap = view()
    pipeline = Pipeline(policy, lambda _pool: snap)
    body = chat("word " * 10_000)  # 50 KB: over exact_count_inline_bytes: never counted on
    assert pipeline.needs_helper(body)  # the event loop after the answer, but in the helper
    exact = exact_tokens(pipeline, body)
    offload = Offload(str(path), pipeline.max_body_bytes)
    try:
        # the helper's own count (and its start-up, before the judge's budget runs)
        route, facts = pipeline.router.resolve(()), RequestFacts(adapter=BY_NAME["openai.chat"])
        counted = asyncio.run(offload.count(route, facts, body))
        assert counted is not None and counted.input_tokens == exact
        headers, answered, recounted = hold_through_servicer(
            ExtProcServicer(pipeline, offload), body
        )
    finally:
        offload.close()
    assert "x-ice-tokens=estimate" in headers
    assert answered > math.ceil((exact + 8) / BS)
    assert recounted == math.ceil((exact + 8) / BS)


def test_a_long_body_with_no_helper_keeps_its_bound() -> None:
    policy = parse_policy(POLICY_TEXT)
    snap = view()
    pipeline = Pipeline(policy, lambda _pool: snap)
    body = chat("word " * 10_000)  # judged in-process (no helper): never counted on the loop
    skipped = recounts("skipped")
    headers, answered, recounted = hold_through_servicer(ExtProcServicer(pipeline), body)
    assert "x-ice-tokens=estimate" in headers
    assert recounted == answered
    assert recounts("skipped") == skipped + 1
