"""The live prefix_stability_score: a policy with ``prefix_tracking`` observes sampled requests'
prompts in the pipeline and exports ``ice_prefix_stability_score{route}``; off by default."""

from __future__ import annotations

import json
import time

from prometheus_client import REGISTRY

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

SHARED = "You are a careful assistant for a travel agency. " * 12


def _pipeline(extra: str) -> Pipeline:
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    calm = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    return Pipeline(parse_policy(default_policy_text() + extra), lambda _pool: calm)


def _send(pipeline: Pipeline, system: str) -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": system}]}
    body["messages"].append({"role": "user", "content": "hi"})
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    pipeline.on_body(route, RequestFacts(adapter=OPENAI_CHAT), json.dumps(body).encode())


def test_identical_prompts_score_high_and_a_leading_timestamp_scores_low() -> None:
    stable = _pipeline("prefix_tracking: {enabled: true, sample_every: 1}\n")
    for _ in range(10):
        _send(stable, SHARED)
    high = REGISTRY.get_sample_value("ice_prefix_stability_score", {"route": "chat", "tenant": ""})
    assert high is not None and high > 0.8  # 9 of 10 prompts reuse all but their last block
    broken = _pipeline("prefix_tracking: {enabled: true, sample_every: 1}\n")
    for i in range(10):
        _send(broken, f"Now: 2026-12-02T06:{i:02d}:00Z. " + SHARED)
    low = REGISTRY.get_sample_value("ice_prefix_stability_score", {"route": "chat", "tenant": ""})
    assert low is not None and low < 0.1


def test_off_by_default_and_sampled_when_on() -> None:
    assert _pipeline("").prefix is None
    sampled = _pipeline("prefix_tracking: {enabled: true, sample_every: 4}\n")
    for _ in range(8):
        _send(sampled, SHARED)
    assert sampled.prefix.tracker.scores()  # 2 of 8 observed
    assert sampled.prefix.seen == 8


def test_the_sampled_request_also_gives_the_routes_system_prompt_weight() -> None:
    from ext_proc.sysprompt.complexity import system_prompt_complexity

    pipeline = _pipeline("prefix_tracking: {enabled: true, sample_every: 1}\n")
    _send(pipeline, SHARED)
    got = REGISTRY.get_sample_value("ice_system_prompt_complexity_score", {"route": "chat"})
    body = {"model": "m", "messages": [{"role": "system", "content": SHARED}]}
    body["messages"].append({"role": "user", "content": "hi"})
    features = OPENAI_CHAT.features(body)
    want = system_prompt_complexity(body, OPENAI_CHAT, features).score
    assert got == want
    assert 0.45 < want <= 0.5  # almost all system prompt, none of it JSON: × 0.5


def test_a_running_ice_says_where_the_prompts_of_a_route_diverge() -> None:
    """The live report: the timestamp's place and kind as a gauge, never the prompt."""
    pipeline = _pipeline("prefix_tracking: {enabled: true, sample_every: 1}\n")
    for i in range(16):
        _send(pipeline, f"Now: 2026-12-02T06:{i:02d}:00Z. " + SHARED)
    labels = {"route": "chat", "section": "system prompt", "kind": "timestamp"}
    assert REGISTRY.get_sample_value("ice_prefix_divergence_character", labels) == 5
    # once the prompts stop changing there, the place is reported gone (-1)
    for _ in range(16):
        _send(pipeline, SHARED)
    assert REGISTRY.get_sample_value("ice_prefix_divergence_character", labels) == -1


def test_section_labels_are_bounded() -> None:
    from ext_proc.prefix.live import metric_section

    assert metric_section("system prompt") == "system prompt"
    assert metric_section("message 3 (user)") == "message 3"
    assert metric_section("message 12 (assistant)") == "message 9+"
    assert metric_section("last message (user)") == "other"


def test_with_a_tokenizer_the_live_score_counts_exact_tokens() -> None:
    """A model with a tokenizer and a chat template: blocks of its exact prompt ids, as
    vLLM renders and tokenizes the chat."""
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data"
    text = default_policy_text() + (
        "tokenizers:\n  tiny: {model_dir: vllm_cpu/tokenizer}\n"
        "prefix_tracking: {enabled: true, sample_every: 1}\n"
    )
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    calm = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(parse_policy(text, base_dir=data), lambda _pool: calm)
    messages = [{"role": "system", "content": SHARED}, {"role": "user", "content": "hi"}]
    counter = pipeline.counters.counter_for("tiny")
    exact = len(counter.token_ids(counter.render_chat(messages)))
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    body = json.dumps({"model": "tiny", "messages": messages}).encode()
    for _ in range(2):
        pipeline.on_body(route, RequestFacts(adapter=OPENAI_CHAT), body)
    stats = pipeline.prefix.tracker.stats("chat\x00")  # route "chat", no tenant
    assert stats is not None
    assert stats.total_blocks == 2 * (exact // 16)  # each prompt's full blocks of exact ids
    assert stats.shared_blocks == (exact - 1) // 16  # the second reuses all vLLM would


def test_a_tenant_header_keeps_the_score_per_tenant_with_bounded_labels() -> None:
    text = (
        "prefix_tracking: {enabled: true, sample_every: 1, tenant_header: x-tenant,"
        " max_tenants: 2}\n"
    )
    pipeline = _pipeline(text)
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    for tenant, prompt in (
        ("a", SHARED),
        ("a", SHARED),
        ("b", "Other words. " * 40),
        ("c", SHARED),
    ):
        facts = pipeline.on_headers(
            route,
            [
                ("x-tenant", tenant.encode()),
                (":path", b"/v1/chat/completions"),
                ("content-type", b"application/json"),
            ],
            False,
        )
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "hi"}],
        }
        pipeline.on_body(route, facts, json.dumps(body).encode())
    got = {
        t: REGISTRY.get_sample_value("ice_prefix_stability_score", {"route": "chat", "tenant": t})
        for t in ("a", "b", "other")
    }
    assert got["a"] is not None and got["a"] > 0.4  # its second prompt reused the first's blocks
    assert got["b"] == 0.0  # one prompt: nothing seen before
    assert got["other"] == 0.0  # a third tenant past max_tenants: "other", its own table
