"""No body walks around ICE: seeded bodies judged by a real Pipeline, re-read as backends do.

Drives ``bench/bypass_fuzz.py``: 3,000 bodies (every judged endpoint and SGLang's, at four
pressures), every body ICE lets go on read by the fuzzer's own backend reader under both
duplicate-key readings. The generator must really make the hard cases (repeated limit keys,
n > 1, media, prompt lists …) and some of them must reach the checker, and the checker must
catch a hand-made verdict that allows less than the body asks, rule by rule, so that a silent
checker or a tame generator cannot pass.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import BodyVerdict
from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.schemas import ADAPTERS, SCHEMAS
from ext_proc.schemas.base import RequestFeatures
from tests.builders import load_bench

fuzz = load_bench("bypass_fuzz.py", "bypass_fuzz")
SEED = 20240
BODIES = 3000


@pytest.fixture(scope="module")
def report() -> Any:
    return fuzz.run(BODIES, SEED)


def test_no_body_walks_around_ice(report: Any) -> None:
    found = report.bypasses
    kinds = sorted({(b.kind, b.endpoint) for b in found})
    detail = ""
    if found:
        b = min(found, key=lambda b: len(b.forwarded))  # the shortest, to read
        detail = (
            f"\nshortest: {b.kind} on {b.endpoint} ({b.how}): backend reads {b.backend}, "
            f"ICE allowed {b.allowed}\nverdict: {b.verdict}\nforwarded: {b.forwarded[:800]}"
        )
    count = len(found)
    assert count == 0, f"{count} bypasses: {kinds}{detail}"


def test_every_judged_path_and_sglang_is_fuzzed(report: Any) -> None:
    assert set(ADAPTERS) <= {path for path, _ in fuzz.ENDPOINTS.values()}
    route = fuzz.Judge().pipelines["low"].router.resolve([("x-ice-route", "sglang")])
    assert route.schema is SCHEMAS["sglang_generate"]
    assert set(report.per_endpoint) == set(fuzz.ENDPOINTS)
    assert set(report.scenarios) == {"low", "medium", "high", "critical"}


# endpoint → hard case → (at least this many generated, at least this many went on)
HARD_CASES: dict[str, dict[str, tuple[int, int]]] = {
    "chat": {
        "dup_limit": (15, 0),
        "dup_n": (10, 0),
        "dup_nested": (20, 0),
        "null_limit": (20, 8),
        "n>1": (100, 30),
        "media": (100, 30),
        "media_untyped": (30, 10),
        "media_uuid": (15, 3),
        "media_embeds": (20, 5),
        "escaped_key": (20, 5),
        "priority": (15, 5),
    },
    "completions": {
        "dup_limit": (10, 0),
        "dup_n": (10, 0),
        "null_limit": (20, 6),
        "n>1": (100, 30),
        "prompt_list": (50, 10),
        "prompt_embeds": (5, 0),  # refused: 400 unsupported_field
    },
    "messages": {"dup_limit": (10, 0), "dup_nested": (20, 0), "media": (100, 40)},
    "responses": {
        "dup_limit": (10, 0),
        "null_limit": (15, 10),
        "media": (50, 25),
        "previous_response_id": (40, 20),
    },
    "embeddings": {
        "prompt_list": (40, 30),
        "media": (30, 15),
        "input_and_messages": (15, 0),
    },  # 400 ambiguous
    "chat_batch": {
        "dup_limit": (15, 0),
        "n>1": (100, 15),
        "media": (100, 20),
        "prompt_list": (100, 10),
    },
    "invocations": {
        "dup_limit": (10, 0),
        "null_limit": (20, 8),
        "n>1": (80, 25),
        "media": (60, 20),
        "hybrid": (40, 0),  # more than one shape key: 400 ambiguous_invocation
    },
    "generate_tokens": {
        "dup_limit": (10, 0),
        "dup_n": (8, 0),
        "dup_nested": (20, 0),
        "null_limit": (15, 6),
        "n>1": (60, 25),
        "media": (20, 6),
        "priority": (15, 5),
    },
    "sglang": {
        "dup_limit": (10, 0),
        "dup_n": (8, 0),
        "null_limit": (15, 4),
        "n>1": (60, 20),
        "media": (30, 12),
        "prompt_list": (50, 15),
        "sampling_list": (30, 10),
        "priority": (10, 3),
    },
}


@pytest.mark.parametrize("endpoint", list(HARD_CASES), ids=list(HARD_CASES))
def test_the_generator_makes_the_hard_cases(report: Any, endpoint: str) -> None:
    made, went_on = report.tags[endpoint], report.forwarded_tags[endpoint]
    short = [
        f"{tag}: {made[tag]} made (want {low_made}), {went_on[tag]} went on (want {low_on})"
        for tag, (low_made, low_on) in HARD_CASES[endpoint].items()
        if made[tag] < low_made or went_on[tag] < low_on
    ]
    outcomes = report.outcomes[endpoint]
    wanted = {"passed": 20, "rejected": 10, "bad_request": 20}
    if endpoint != "embeddings":  # embeddings have no output to downgrade
        wanted["downgraded"] = 10
    short += [f"{o}: {outcomes[o]} (want {n})" for o, n in wanted.items() if outcomes[o] < n]
    assert not short, short


# --- the checker catches a verdict that allows less than the body asks --------------------

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def features(**kw: Any) -> RequestFeatures:
    base: dict[str, Any] = {
        "schema": "openai.chat",
        "model": None,
        "input_tokens": 10,
        "max_tokens": None,
        "max_tokens_field": None,
        "stream": False,
        "message_count": 1,
    }
    base.update(kw)
    return RequestFeatures(**base)


def chat(parts: Any, **top: Any) -> str:
    return json.dumps({"messages": [{"role": "user", "content": parts}], **top})


PASS = Pass(None)


def down(limit: int, reason: str = "pressure_cap") -> Downgrade:
    return Downgrade(None, limit, None, reason)


# (id, endpoint, body text, features, decision, forwarded body or None, the kinds found)
# fmt: off
CHECKS: list[tuple[str, str, str, dict[str, Any], Any, str | None, list[str]]] = [
    # output limits, both duplicate-key readings
    ("last-copy-asks-more", "chat", '{"messages":[],"max_tokens":10,"max_tokens":5000}',
     {"max_tokens": 10}, PASS, None, ["output_limit"]),
    ("first-copy-asks-more", "chat", '{"messages":[],"max_tokens":5000,"max_tokens":10}',
     {"max_tokens": 10}, PASS, None, ["output_limit"]),
    ("max-completion-tokens-wins", "chat",
     '{"messages":[],"max_completion_tokens":10,"max_tokens":5000}',
     {"max_tokens": 10}, PASS, None, []),
    ("null-max-completion-tokens-falls-back", "chat",
     '{"messages":[],"max_completion_tokens":null,"max_tokens":5000}',
     {"max_tokens": 10}, PASS, None, ["output_limit"]),
    ("downgrade-never-written", "chat", '{"messages":[]}', {}, down(100), None,
     ["output_limit"]),
    ("downgrade-written", "chat", '{"messages":[]}', {}, down(100),
     '{"messages":[],"max_tokens":100}', []),
    ("downgrade-injected-after-null", "chat", '{"messages":[],"max_tokens":null}', {},
     down(100), '{"messages":[],"max_tokens":null, "max_tokens": 100}', ["output_limit"]),
    ("completions-absent-is-16", "completions", '{"prompt":"x"}',
     {"schema": "openai.completions", "max_tokens": 16}, PASS, None, []),
    ("responses-max-output-tokens", "responses", '{"input":"x","max_output_tokens":900}',
     {"schema": "openai.responses", "max_tokens": 100}, PASS, None, ["output_limit"]),
    ("anthropic-max-tokens", "messages", '{"messages":[],"max_tokens":900}',
     {"schema": "anthropic.messages", "max_tokens": 100}, PASS, None, ["output_limit"]),
    # vLLM 0.32: a sampling_params without max_tokens runs to the end of the context
    ("vllm-generate-absent-is-not-16", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{}}',
     {"schema": "vllm.generate", "max_tokens": 16}, PASS, None, ["output_limit"]),
    ("vllm-generate-absent-runs-to-the-end", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{}}',
     {"schema": "vllm.generate"}, PASS, None, []),
    # the output ICE charged: a null limit judged as the API's absent default is caught,
    # judged as the backend runs it is not
    ("completions-null-is-16", "completions", '{"prompt":"x","max_tokens":null}',
     {"schema": "openai.completions"}, PASS, None, []),
    ("completions-null-is-not-8", "completions", '{"prompt":"x","max_tokens":null}',
     {"schema": "openai.completions", "max_tokens": 8}, PASS, None, ["output_limit"]),
    ("generate-null-charged-16", "generate_tokens",  # a charge of completions' 16
     '{"token_ids":[1],"sampling_params":{"max_tokens":null}}',
     {"schema": "openai.completions"}, PASS, None, ["output_charge"]),
    ("generate-null-charged-rest", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{"max_tokens":null}}',
     {"schema": "vllm.generate", "limit_null": True}, PASS, None, []),
    ("sglang-null-charged-128", "sglang", '{"text":"x","sampling_params":{"max_new_tokens":null}}',
     {"schema": "sglang.generate"}, PASS, None, ["output_charge"]),
    ("generate-null-n16-downgraded", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{"n":16,"max_tokens":null}}',
     {"schema": "vllm.generate", "samples": 16, "limit_null": True}, down(900),
     '{"token_ids":[1],"sampling_params":{"n":16,"max_tokens":900}}', []),
    # the body's priority under client_priority: cap (the fuzz policy's routes)
    ("priority-ahead", "chat", '{"messages":[],"max_tokens":5,"priority":-1}',
     {"max_tokens": 5}, PASS, None, ["body_priority"]),
    ("priority-ahead-as-a-string", "completions", '{"prompt":"x","priority":" -3 "}',
     {"schema": "openai.completions", "max_tokens": 16}, PASS, None, ["body_priority"]),
    ("priority-ahead-as-a-float", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{"max_tokens":5},"priority":-1.0}',
     {"schema": "vllm.generate", "max_tokens": 5}, PASS, None, ["body_priority"]),
    ("priority-first-copy-ahead", "embeddings", '{"input":"x","priority":-5,"priority":5}',
     {"schema": "openai.embeddings", "generates": False}, PASS, None, ["body_priority"]),
    ("priority-behind", "chat", '{"messages":[],"max_tokens":5,"priority":5}',
     {"max_tokens": 5}, PASS, None, []),
    ("priority-not-read-by-messages", "messages",
     '{"messages":[],"max_tokens":5,"priority":-9}',
     {"schema": "anthropic.messages", "max_tokens": 5}, PASS, None, []),
    ("priority-any-on-sglang", "sglang",
     '{"text":"x","sampling_params":{"max_new_tokens":5},"priority":5}',
     {"schema": "sglang.generate", "max_tokens": 5}, PASS, None, ["body_priority"]),
    ("priority-removed", "chat", '{"messages":[],"max_tokens":5,"priority":-1}',
     {"max_tokens": 5}, PASS, '{"messages":[],"max_tokens":5}', []),
    ("vllm-generate-absent-above-8", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{}}',
     {"schema": "vllm.generate", "max_tokens": 8}, PASS, None, ["output_limit"]),
    ("vllm-generate-null-is-unbounded", "generate_tokens",
     '{"token_ids":[1],"sampling_params":{"max_tokens":null}}',
     {"schema": "vllm.generate", "max_tokens": 16}, PASS, None, ["output_limit"]),
    ("sglang-absent-is-128", "sglang", '{"text":"x"}',
     {"schema": "sglang.generate", "max_tokens": 16}, PASS, None, ["output_limit"]),
    ("sglang-list-takes-the-largest", "sglang",
     '{"text":["a","b"],"sampling_params":[{"max_new_tokens":10},{"max_new_tokens":500}]}',
     {"schema": "sglang.generate", "max_tokens": 10, "prompt_tokens": (1, 1)}, PASS, None,
     ["output_limit"]),
    # sequences
    ("chat-n", "chat", '{"messages":[],"n":4,"max_tokens":5}', {"max_tokens": 5}, PASS,
     None, ["sequences"]),
    ("completions-best-of", "completions", '{"prompt":"x","best_of":3,"max_tokens":5}',
     {"schema": "openai.completions", "max_tokens": 5}, PASS, None, ["sequences"]),
    ("completions-prompt-list", "completions", '{"prompt":["a","b","c"],"max_tokens":5}',
     {"schema": "openai.completions", "max_tokens": 5, "prompt_tokens": (1, 1)}, PASS,
     None, ["sequences"]),
    ("token-ids-are-one-prompt", "completions", '{"prompt":[1,2,3],"max_tokens":5}',
     {"schema": "openai.completions", "max_tokens": 5}, PASS, None, []),
    ("completions-prompt-embeds", "completions",
     '{"prompt":"x","prompt_embeds":["AAAA"],"max_tokens":5}',
     {"schema": "openai.completions", "max_tokens": 5}, PASS, None, ["sequences"]),
    ("batch-conversations", "chat_batch", '{"messages":[[],[]],"max_tokens":5}',
     {"schema": "openai.chat_batch", "max_tokens": 5}, PASS, None, ["sequences"]),
    ("embeddings-inputs", "embeddings", '{"input":["a","b","c"]}',
     {"schema": "openai.embeddings", "generates": False, "prompt_tokens": (1, 1)}, PASS,
     None, ["sequences"]),
    ("sglang-n-per-prompt", "sglang",
     '{"text":["a","b"],"sampling_params":{"n":3,"max_new_tokens":5}}',
     {"schema": "sglang.generate", "max_tokens": 5, "prompt_tokens": (1, 1), "samples": 2},
     PASS, None, ["sequences"]),
    ("invocations-read-as-completions", "invocations",
     '{"messages":[{"content":"hi"}],"prompt":["a","b","c"],"max_tokens":5}',
     {"max_tokens": 5}, PASS, None, ["sequences"]),
    # media parts
    ("typed-image", "chat", chat([{"type": "image_url", "image_url": {"url": PNG}}]),
     {"media_parts": 0}, PASS, None, ["media_parts"]),
    ("typed-image-counted", "chat", chat([{"type": "image_url", "image_url": {"url": PNG}}]),
     {"media_parts": 1}, PASS, None, []),
    ("untyped-image-url-string", "chat", chat([{"image_url": PNG}]), {}, PASS, None,
     ["media_parts"]),
    ("untyped-image-object-is-refused-by-vllm", "chat", chat([{"image_url": {"url": PNG}}]),
     {}, PASS, None, []),
    ("text-part-with-uuid", "chat",
     chat([{"type": "text", "text": "x", "uuid": "u", "image_url": PNG}]), {}, PASS, None,
     ["media_parts"]),
    ("audio-embeds", "chat", chat([{"type": "audio_embeds", "audio_embeds": "AAAA"}]), {},
     PASS, None, ["media_parts"]),
    ("anthropic-image-in-tool-result", "messages",
     json.dumps({"messages": [{"role": "user", "content": [{"type": "tool_result",
     "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]}],
     "max_tokens": 5}),
     {"schema": "anthropic.messages", "max_tokens": 5}, PASS, None, ["media_parts"]),
    ("responses-input-image", "responses",
     json.dumps({"input": [{"role": "user", "content": [{"type": "input_image",
     "image_url": PNG}]}], "max_output_tokens": 5}),
     {"schema": "openai.responses", "max_tokens": 5}, PASS, None, ["media_parts"]),
    ("embeddings-messages-beside-input", "embeddings",
     json.dumps({"input": "x", "messages": [{"role": "user", "content": [{"type":
     "image_url", "image_url": {"url": PNG}}]}]}),
     {"schema": "openai.embeddings", "generates": False}, PASS, None, ["media_parts"]),
    ("sglang-image-data", "sglang", json.dumps({"text": "x", "image_data": [PNG, [PNG]],
     "sampling_params": {"max_new_tokens": 5}}),
     {"schema": "sglang.generate", "max_tokens": 5, "media_parts": 1}, PASS, None,
     ["media_parts"]),
]
# fmt: on


@pytest.mark.parametrize(
    ("endpoint", "body", "feats", "decision", "forwarded", "kinds"),
    [c[1:] for c in CHECKS],
    ids=[c[0] for c in CHECKS],
)
def test_the_checker_catches_what_the_verdict_does_not_allow(
    endpoint: str,
    body: str,
    feats: dict[str, Any],
    decision: Any,
    forwarded: str | None,
    kinds: list[str],
) -> None:
    out = None if forwarded is None else forwarded.encode()
    verdict = BodyVerdict(decision, features(**feats), Continue([], out))
    found = fuzz.check(endpoint, body.encode(), verdict)
    assert sorted({b.kind for b in found}) == sorted(kinds)


@pytest.mark.parametrize(
    ("verdict", "kind"),
    [
        (None, "unjudged"),
        (BodyVerdict(None, None, Continue([], None), bad="invalid_type"), "unjudged"),
        (
            BodyVerdict(Reject(None, 429, "x", "m"), features(), Continue([], None)),
            "reject_goes_on",
        ),
        (BodyVerdict(down(5), features(), Continue([], b'{"messages":[')), "invalid_rewrite"),
        (BodyVerdict(down(5), features(), Continue([], b'{"max_tokens":5}')), "rewrite_changed"),
    ],
    ids=[
        "on-body-none",
        "not-judged-goes-on",
        "rejected-goes-on",
        "rewrite-not-json",
        "rewrite-dropped-messages",
    ],
)
def test_the_checker_catches_a_body_ice_did_not_judge_or_broke(verdict: Any, kind: str) -> None:
    found = fuzz.check("chat", b'{"messages":[]}', verdict)
    assert kind in {b.kind for b in found}


def test_an_immediate_answer_sends_nothing_on() -> None:
    verdict = BodyVerdict(None, None, Respond(400, [], b"{}"), bad="invalid_type")
    assert fuzz.check("chat", b'{"messages":[],"max_tokens":99999}', verdict) == []


def test_raw_json_keeps_repeated_and_escaped_keys() -> None:
    text = fuzz.dump(fuzz.Obj((fuzz.Esc("max_tokens"), 1), ("max_tokens", 2)))
    assert text == '{"max_t\\u006fkens":1,"max_tokens":2}'
    assert json.loads(text) == {"max_tokens": 2}
    assert json.loads(text, object_pairs_hook=fuzz.first_copy_wins) == {"max_tokens": 1}


def test_the_coarse_verdict_is_checked_against_the_full_one(report: Any) -> None:
    # every judged body is also judged from its size: every API reads a field no size
    # bounds (issue 44), so none passes, the coarse family's included
    assert report.coarse["passed"] == 0 and report.coarse["rejected"] > 2500
    assert report.coarse_family["rejected"] >= 100


@pytest.fixture(scope="module")
def blind_report() -> Any:
    """The same bodies judged by the coarse verdict as before issue 44 (blind to what a body
    sets in a few bytes)."""
    return fuzz.run(BODIES, SEED, unread_bounds=False)


def test_the_checker_catches_the_coarse_passes_of_before(blind_report: Any) -> None:
    """Before: beside passes of bodies the full verdict also passes, coarse passes of
    bodies it refuses (n past max_sequences, 2,049 inputs …) and cuts (a limit past the
    context), the coarse family's among them."""
    assert blind_report.coarse["passed"] > 300 and blind_report.coarse_family["passed"] > 20
    kinds = {b.kind for b in blind_report.bypasses}
    assert kinds == {"coarse_passes_a_refusal", "coarse_passes_a_cut"}
    refused = {b.endpoint for b in blind_report.bypasses if b.kind == "coarse_passes_a_refusal"}
    assert refused == set(fuzz.ENDPOINTS)
    n_500 = [b for b in blind_report.bypasses if '"n":500' in b.body]
    assert n_500, "no coarse pass of an n: 500 body was caught"


@pytest.mark.parametrize(
    ("full", "kind"),
    [
        (BodyVerdict(down(1024, "pressure_cap"), features(), Continue([], b"{}")), "cut"),
        (BodyVerdict(down(50, "kv_free_blocks"), features(), Continue([], b"{}")), "cut"),
        (BodyVerdict(down(7000, "context_budget"), features(), Continue([], b"{}")), "cut"),
        (BodyVerdict(Pass(None), features(), Continue([], b'{"a":1}')), "cut"),  # a rewrite
        (
            BodyVerdict(Reject(None, 429, "kv_exhausted", "m"), features(), Continue([], None)),
            "refusal",
        ),
        (
            BodyVerdict(
                Reject(None, 400, "too_many_sequences", "m"), features(), Continue([], None)
            ),
            "refusal",
        ),
        (BodyVerdict(None, None, Respond(400, [], b"{}"), bad="invalid_json"), "refusal"),
        (BodyVerdict(Pass(None), features(), Continue([], None)), ""),
    ],
    ids=["cap", "kv-fit", "context", "rewrite", "shed", "too-many-sequences", "bad-body", "pass"],
)
def test_a_coarse_pass_where_the_full_verdict_refuses_or_cuts_is_caught(
    full: Any, kind: str
) -> None:
    coarse = BodyVerdict(Pass(None), features(), Continue([], None))
    found = {b.kind for b in fuzz.check_coarse("chat", full, coarse)}
    assert found == ({f"coarse_passes_a_{kind}"} if kind else set())
    refused = BodyVerdict(
        Reject(None, 429, "memory_pressure", "m"), features(), Respond(429, [], b"{}")
    )
    assert fuzz.check_coarse("chat", full, refused) == []
