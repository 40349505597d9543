"""Endpoint placement: where a request is judged in a pool of several backends, and, with
``endpoint_pick: ice``, where it is sent (pure, hand-computed; no Envoy)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from ext_proc.admit.outcome import Continue
from ext_proc.admit.pipeline import Pipeline
from ext_proc.placement.endpoints import Affinity, Candidate, endpoint_of, pick, prefix_key
from ext_proc.policy.evaluate import Shape
from ext_proc.policy.load import parse_policy
from ext_proc.serve import render
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

FULL = "http://10.0.0.1:8000/metrics"
IDLE = "http://10.0.0.2:8000/metrics"


def policy_text(mode: str) -> str:
    return f"""
profiles:
  default: {{max_model_len: 8192, output_buffer_tokens: 512, min_output_tokens: 16}}
pools:
  default:
    metrics_urls: ["{FULL}", "{IDLE}"]
    endpoint_pick: {mode}
"""


def backend(url: str, usage: float, waiting: float = 0.0, stale: bool = False) -> BackendSignals:
    # 101 blocks of 128 tokens: 100 usable; free = floor(100 × (1 − usage))
    return BackendSignals(
        url=url,
        kv_cache_usage=usage,
        num_requests_waiting=waiting,
        num_requests_running=1,
        num_gpu_blocks=101,
        block_size=128,
        stale=stale,
    )


def pool(full_usage: float = 0.92, idle_usage: float = 0.0, **kw: bool) -> PoolSnapshot:
    # full: floor(100 × 0.08) = 8 free blocks; idle: 100 free
    backends = (backend(FULL, full_usage), backend(IDLE, idle_usage, stale=kw.get("stale", False)))
    return PoolSnapshot(pool="default", backends=backends, taken_at_s=time.monotonic())


def judge(
    mode: str,
    snap: PoolSnapshot,
    max_tokens: int = 1900,
    system: str = "",
    headers: dict[str, str] | None = None,
) -> tuple[Pipeline, object]:
    pipeline = Pipeline(parse_policy(policy_text(mode)), lambda _p: snap)
    return pipeline, judge_with(pipeline, max_tokens, system, headers)


def judge_with(
    pipeline: Pipeline,
    max_tokens: int = 1900,
    system: str = "",
    headers: dict[str, str] | None = None,
) -> object:
    route = pipeline.router.resolve([])
    pairs = [(":path", b"/v1/chat/completions"), (":method", b"POST")]
    pairs += [(k, v.encode()) for k, v in (headers or {}).items()]
    facts = pipeline.on_headers(route, pairs, end_of_stream=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "hi"}
    ]
    body = json.dumps({"messages": messages, "max_tokens": max_tokens}).encode()
    verdict = pipeline.on_body(route, facts, body)
    assert verdict is not None
    pipeline.recorder.record(route, verdict)
    return verdict


def headers_of(verdict: object) -> dict[str, str]:
    return dict(verdict.outcome.headers)  # type: ignore[attr-defined]


# "hi" + framing ≈ 8 tokens; 1900 output → ceil(1908 / 128) = 15 blocks: fits the idle
# backend (100 free), not the full one (8 free)


def test_none_judges_against_the_endpoint_with_the_least_room() -> None:
    _, v = judge("none", pool())
    # 8 free blocks = 1,024 tokens: output ≤ 1024 − 8 = 1016 fits them
    assert v.decision.decision == "downgrade"  # type: ignore[attr-defined]
    assert v.decision.reason == "kv_free_blocks"  # type: ignore[attr-defined]
    assert v.decision.max_tokens == 1024 - 8  # type: ignore[attr-defined]
    assert "x-gateway-destination-endpoint" not in headers_of(v)


def test_ice_picks_the_endpoint_where_the_request_fits() -> None:
    _, v = judge("ice", pool())
    assert v.decision.decision == "pass"  # type: ignore[attr-defined]
    h = headers_of(v)
    assert h["x-gateway-destination-endpoint"] == "10.0.0.2:8000"
    assert h["x-ice-endpoint"] == "10.0.0.2:8000"
    assert v.outcome.lb_endpoint == "10.0.0.2:8000"  # type: ignore[attr-defined]


def test_ice_counts_a_pick_against_that_endpoints_ledger_only() -> None:
    snap = pool(full_usage=0.0, idle_usage=0.0)  # both 100 free
    pipeline, first = judge("ice", snap, max_tokens=1900)
    chosen = headers_of(first)["x-ice-endpoint"]
    second = judge_with(pipeline, max_tokens=1900)
    # the first took 15 blocks where it went: the other endpoint now has the most room
    assert headers_of(second)["x-ice-endpoint"] != chosen
    ledger = pipeline.views.ledger(snap)
    assert ledger == {"10.0.0.1:8000": 15, "10.0.0.2:8000": 15}


def test_ice_follows_a_shared_prefix_while_it_fits() -> None:
    snap = pool(full_usage=0.5, idle_usage=0.0)  # 50 and 100 free
    pipeline, first = judge("ice", snap, max_tokens=100, system="You are a support bot.")
    assert headers_of(first)["x-ice-endpoint"] == "10.0.0.2:8000"  # the most room
    pipeline.views.hold(
        pipeline.router.resolve([]).profile,
        snap,
        Shape.single(128 * 60),
        0,
        "10.0.0.2:8000",
    )  # 60 more blocks there: 25 left, the other has 50
    again = judge_with(pipeline, max_tokens=100, system="You are a support bot.")
    assert headers_of(again)["x-ice-endpoint"] == "10.0.0.2:8000"  # affinity, it still fits
    other = judge_with(pipeline, max_tokens=100, system="A different assistant.")
    assert headers_of(other)["x-ice-endpoint"] == "10.0.0.1:8000"  # no affinity: most room


def test_ice_downgrades_for_the_endpoint_with_the_most_room_when_none_fits() -> None:
    snap = pool(full_usage=0.95, idle_usage=0.9)  # 5 and 10 free blocks
    _, v = judge("ice", snap, max_tokens=4000)
    assert v.decision.decision == "downgrade"  # type: ignore[attr-defined]
    # 10 blocks = 1,280 tokens less the input's 8
    assert v.decision.max_tokens == 1280 - 8  # type: ignore[attr-defined]
    assert headers_of(v)["x-ice-endpoint"] == "10.0.0.2:8000"


def test_ice_does_not_pick_a_stale_endpoint() -> None:
    _, v = judge("ice", pool(full_usage=0.0, stale=True))  # the idle one is stale
    assert headers_of(v)["x-ice-endpoint"] == "10.0.0.1:8000"


def test_a_client_sent_destination_never_chooses_and_is_stripped() -> None:
    spoof = {"x-gateway-destination-endpoint": "10.0.0.1:8000"}
    pipeline = Pipeline(parse_policy(policy_text("ice")), lambda _p: pool())
    route = pipeline.router.resolve([])
    pairs = [(":path", b"/v1/chat/completions"), (":method", b"POST")]
    facts = pipeline.on_headers(route, pairs + [(k, v.encode()) for k, v in spoof.items()], False)
    assert "x-gateway-destination-endpoint" in facts.strip and facts.endpoint is None
    v = judge_with(pipeline, headers=spoof)
    assert headers_of(v)["x-gateway-destination-endpoint"] == "10.0.0.2:8000"


@pytest.mark.parametrize(
    ("named", "decision", "endpoint"),
    [
        ("10.0.0.2:8000", "pass", "10.0.0.2:8000"),
        ("10.0.0.1:8000", "downgrade", "10.0.0.1:8000"),
        ("10.9.9.9:8000", "downgrade", "unknown"),  # judged as the pool's worst
    ],
    ids=["idle-named", "full-named", "unknown-named"],
)
def test_header_mode_judges_against_the_named_endpoint(
    named: str, decision: str, endpoint: str
) -> None:
    _, v = judge("header", pool(), headers={"x-gateway-destination-endpoint": named})
    assert v.decision.decision == decision  # type: ignore[attr-defined]
    h = headers_of(v)
    assert h["x-ice-endpoint"] == endpoint
    assert "x-gateway-destination-endpoint" not in h  # ICE does not re-route


def test_a_picked_continue_renders_the_pick_in_envoy_lb_metadata() -> None:
    out = Continue([("x-gateway-destination-endpoint", "10.0.0.2:8000")], None, "10.0.0.2:8000")
    resp = render.render_body_outcome(out)
    lb = resp.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.2:8000"
    plain = render.render_body_outcome(Continue([], None))
    assert "envoy.lb" not in plain.dynamic_metadata.fields


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.1:8000/metrics", "10.0.0.1:8000"),
        ("https://vllm.llm.svc/metrics", "vllm.llm.svc:443"),
        ("http://[fd00::1]:8000/metrics", "[fd00::1]:8000"),
        ("10.0.0.7:8000", "10.0.0.7:8000"),  # a Prometheus instance label
    ],
    ids=["ip", "https-default-port", "ipv6", "instance-label"],
)
def test_endpoint_of_a_metrics_source(url: str, expected: str) -> None:
    assert endpoint_of(url) == expected


def test_backend_endpoints_override_the_metrics_address() -> None:
    assert endpoint_of(FULL, {FULL: "10.0.0.1:9000"}) == "10.0.0.1:9000"


def test_pick_order_affinity_then_room_then_queue() -> None:
    a = Candidate("a", free_blocks=50, need_blocks=10, waiting=0)
    b = Candidate("b", free_blocks=90, need_blocks=10, waiting=3)
    c = Candidate("c", free_blocks=90, need_blocks=10, waiting=1)
    tight = Candidate("d", free_blocks=5, need_blocks=10)
    assert pick([a, b, c], affine="a") == a
    assert pick([a, b, c]) == c  # b and c tie on room; c's queue is shorter
    assert pick([a, tight], affine="d") == a  # affinity only where it fits
    assert pick([tight]) is None


def test_affinity_is_bounded_and_forgets_endpoints_that_left() -> None:
    table = Affinity(size=2)
    table.put("k1", "a")
    table.put("k2", "b")
    table.put("k3", "a")
    assert (table.get("k1"), len(table)) == (None, 2)  # the oldest went
    table.forget(["b"])
    assert (table.get("k3"), table.get("k2")) == (None, "b")


def test_prefix_key_is_the_system_prompt_and_tools() -> None:
    a = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]}
    b = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "y"}]}
    c = {**a, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert prefix_key("openai.chat", a) == prefix_key("openai.chat", b)
    assert prefix_key("openai.chat", a) != prefix_key("openai.chat", c)
    assert prefix_key("openai.chat", {"messages": [{"role": "user", "content": "x"}]}) is None


def test_an_endpoint_that_leaves_the_pool_leaves_the_affinity_table() -> None:
    snap = pool(full_usage=0.0, idle_usage=0.0)
    pipeline, first = judge("ice", snap, max_tokens=100, system="Shared system prompt.")
    went = headers_of(first)["x-ice-endpoint"]
    table = pipeline.placer._affinity["default"]
    assert len(table) == 1
    # the next view has only the other backend: the prefix's entry is forgotten
    other = next(b for b in snap.backends if not b.url.startswith(f"http://{went}"))
    pipeline.lookup = lambda _p: PoolSnapshot(
        pool="default", backends=(other,), taken_at_s=time.monotonic()
    )
    again = judge_with(pipeline, max_tokens=100, system="Shared system prompt.")
    assert headers_of(again)["x-ice-endpoint"] != went
    assert (
        table.get(
            prefix_key(
                "openai.chat",
                {"messages": [{"role": "system", "content": "Shared system prompt."}]},
            )
        )
        != went
    )


def test_ice_picks_only_within_the_subset_hint() -> None:
    snap = pool()
    pipeline = Pipeline(parse_policy(policy_text("ice")), lambda _p: snap)
    route = pipeline.router.resolve([])
    pairs = [(":path", b"/v1/chat/completions"), (":method", b"POST")]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1900})
    only_full = frozenset({"10.0.0.1:8000"})  # only the full one is allowed
    facts = pipeline.on_headers(route, pairs, end_of_stream=False, subset=only_full)
    v = pipeline.on_body(route, facts, body.encode())
    assert v is not None and v.decision is not None
    assert headers_of(v)["x-ice-endpoint"] == "10.0.0.1:8000"
    assert v.decision.decision == "downgrade"  # fits there only downgraded (8 blocks)
    unknown = frozenset({"10.9.9.9:1"})  # none known: not picked, judged as the worst
    facts = pipeline.on_headers(route, pairs, end_of_stream=False, subset=unknown)
    v = pipeline.on_body(route, facts, body.encode())
    assert v is not None and "x-ice-endpoint" not in headers_of(v)


def test_the_subset_hint_is_read_from_forwarded_metadata() -> None:
    from envoy.config.core.v3 import base_pb2
    from google.protobuf import struct_pb2

    from ext_proc.serve.messages import subset_hint as _subset_hint

    def metadata(value: object) -> base_pb2.Metadata:
        md = base_pb2.Metadata()
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": value})
        md.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
        return md

    assert _subset_hint(metadata(["10.0.0.1:8000", "10.0.0.2:8000"])) == {
        "10.0.0.1:8000",
        "10.0.0.2:8000",
    }
    assert _subset_hint(metadata("10.0.0.1:8000, 10.0.0.2:8000")) == {
        "10.0.0.1:8000",
        "10.0.0.2:8000",
    }
    assert _subset_hint(base_pb2.Metadata()) is None
    assert _subset_hint(metadata(5)) is None


def test_new_prefixes_spread_over_equally_good_endpoints() -> None:
    idle = [Candidate(f"10.0.0.{i}:8000", free_blocks=100, need_blocks=3) for i in (1, 2)]
    chosen = {pick(idle, prefix=f"prefix-{k}").endpoint for k in range(16)}  # type: ignore[union-attr]
    assert chosen == {"10.0.0.1:8000", "10.0.0.2:8000"}
    # the same prefix always lands on the same one
    assert pick(idle, prefix="p") == pick(list(reversed(idle)), prefix="p")


# -- sleeping endpoints (vLLM sleep mode: vllm:engine_sleep_state awake = 0) ------------------


def asleep(url: str, usage: float = 0.0, state: str = "weights_offloaded") -> BackendSignals:
    """A backend whose engine sleeps; its gauge may read idle (its KV cache was released)."""
    return replace(backend(url, usage), sleep_state=state)


def snap_of(*backends: BackendSignals) -> PoolSnapshot:
    return PoolSnapshot(pool="default", backends=backends, taken_at_s=time.monotonic())


@pytest.mark.parametrize("max_tokens", [100, 1900], ids=["fits-the-awake-one", "fits-nowhere"])
def test_ice_never_picks_a_sleeping_endpoint(max_tokens: int) -> None:
    # the awake one has 8 free blocks; the sleeping one's gauge says 100 free
    _, v = judge("ice", snap_of(backend(FULL, 0.92), asleep(IDLE)), max_tokens=max_tokens)
    h = headers_of(v)
    assert h["x-ice-endpoint"] == h["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    if max_tokens == 1900:  # 15 blocks fit nowhere awake: downgraded to the 8 free blocks
        assert v.decision.decision == "downgrade"  # type: ignore[attr-defined]
        assert v.decision.max_tokens == 1024 - 8  # type: ignore[attr-defined]
    else:
        assert v.decision.decision == "pass"  # type: ignore[attr-defined]


def test_a_prefix_does_not_follow_its_endpoint_into_sleep() -> None:
    awake = snap_of(backend(FULL, 0.5), backend(IDLE, 0.0))
    pipeline, first = judge("ice", awake, max_tokens=100, system="Shared.")
    assert headers_of(first)["x-ice-endpoint"] == "10.0.0.2:8000"  # the most room
    pipeline.lookup = lambda _p: snap_of(backend(FULL, 0.5), asleep(IDLE))
    again = judge_with(pipeline, max_tokens=100, system="Shared.")
    assert headers_of(again)["x-ice-endpoint"] == "10.0.0.1:8000"


def test_a_sleeping_endpoint_has_no_room() -> None:
    snap = snap_of(backend(FULL, 0.0), asleep(IDLE))
    pipeline = Pipeline(parse_policy(policy_text("ice")), lambda _p: snap)
    profile = pipeline.router.resolve([]).profile
    views = {e.endpoint: e for e in pipeline.views.endpoints(profile, snap)}
    assert views["10.0.0.2:8000"].asleep and views["10.0.0.2:8000"].fit.free_blocks == 0
    assert views["10.0.0.1:8000"].fit.free_blocks == 100
    assert [e.endpoint for e, _ in pipeline.views.candidates(profile, snap)] == ["10.0.0.1:8000"]
    # Envoy's balancer may send a request to either: judged against no free blocks
    none = Pipeline(parse_policy(policy_text("none")), lambda _p: snap)
    fit = none.views.room(profile, snap)
    assert fit is not None and fit.free_blocks == 0


@pytest.mark.parametrize(
    ("mode", "headers"),
    [("none", {}), ("header", {"x-gateway-destination-endpoint": "10.0.0.2:8000"})],
    ids=["none", "header-names-the-sleeping-one"],
)
def test_a_request_that_may_land_on_a_sleeping_endpoint_is_shed(
    mode: str, headers: dict[str, str]
) -> None:
    _, v = judge(mode, snap_of(backend(FULL, 0.0), asleep(IDLE)), headers=headers)
    # input + min_output_tokens: 1 block > 0 free
    assert (v.decision.decision, v.decision.reason) == ("reject", "kv_exhausted")  # type: ignore[attr-defined]
    assert v.outcome.status == 429  # type: ignore[attr-defined]


ALL_ASLEEP = (asleep(FULL, 0.5, "paused"), asleep(IDLE, 0.0, "discard_all"))


@pytest.mark.parametrize("mode", ["none", "ice", "header"])
@pytest.mark.parametrize("priority", ["critical", "standard", "sheddable"])
def test_a_pool_whose_every_endpoint_sleeps_answers_503_at_once(mode: str, priority: str) -> None:
    headers = {"x-priority": priority}
    if mode == "header":
        headers["x-gateway-destination-endpoint"] = "10.0.0.2:8000"
    pipeline, v = judge(mode, snap_of(*ALL_ASLEEP), headers=headers)
    out = v.outcome  # type: ignore[attr-defined]
    assert out.status == 503
    h = dict(out.headers)
    assert h["retry-after"] == "2"  # the profile's retry_after_s
    assert (h["x-ice-decision"], h["x-ice-reason"]) == ("reject", "backend_asleep")
    assert "x-gateway-destination-endpoint" not in h and "x-ice-endpoint" not in h
    error = json.loads(out.body)["error"]
    assert (error["type"], error["code"]) == ("server_error", "backend_asleep")
    assert "asleep" in error["message"]
    assert pipeline.views.ledger(snap_of(*ALL_ASLEEP)) == {}  # nothing went upstream


def _answer(pipeline: Pipeline, path: str, body: dict[str, object]) -> object:
    route = pipeline.router.resolve([])
    facts = pipeline.on_headers(route, [(":path", path.encode()), (":method", b"POST")], False)
    return pipeline.on_body(route, facts, json.dumps(body).encode())


def test_the_503_is_in_the_apis_own_error_format() -> None:
    pipeline = Pipeline(parse_policy(policy_text("none")), lambda _p: snap_of(*ALL_ASLEEP))
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    v = _answer(pipeline, "/v1/messages", body)
    out = v.outcome  # type: ignore[attr-defined]
    doc = json.loads(out.body)
    assert out.status == 503 and doc["type"] == "error"
    assert (doc["error"]["type"], doc["error"]["code"]) == ("overloaded_error", "backend_asleep")
    resp = render.render_body_outcome(out)
    assert resp.immediate_response.status.code == 503


def test_a_coarse_verdict_of_a_sleeping_pool_is_the_503() -> None:
    pipeline = Pipeline(parse_policy(policy_text("ice")), lambda _p: snap_of(*ALL_ASLEEP))
    route = pipeline.router.resolve([])
    facts = pipeline.on_headers(route, [(":path", b"/v1/chat/completions")], False)
    v = pipeline.on_size(route, facts, 2000)
    assert v.outcome.status == 503  # type: ignore[union-attr]
    assert dict(v.outcome.headers)["x-ice-judged"] == "headers"


def test_a_shadow_profile_forwards_and_says_it_would_answer_503() -> None:
    text = policy_text("none").replace(
        "min_output_tokens: 16}", "min_output_tokens: 16, mode: shadow}"
    )
    pipeline = Pipeline(parse_policy(text), lambda _p: snap_of(*ALL_ASLEEP))
    v = judge_with(pipeline)
    h = headers_of(v)
    assert (h["x-ice-decision"], h["x-ice-shadow-reason"]) == ("pass", "backend_asleep")


def test_one_awake_endpoint_is_enough_to_serve() -> None:
    _, v = judge("ice", snap_of(asleep(FULL), backend(IDLE, 0.0)))
    assert v.decision.decision == "pass"  # type: ignore[attr-defined]
    assert headers_of(v)["x-ice-endpoint"] == "10.0.0.2:8000"
