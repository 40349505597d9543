"""The pipeline's truncation step against a real embedding worker process: semantic when it
answers, recency with the reason when it is late or gone, 400 or best effort on overflow,
the helper-process path, and the dry-run CLIs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts, Route
from ext_proc.admit.truncation import finish_truncation
from ext_proc.policy.decision import Downgrade, Reject, Truncated
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.serve.offload import Offload
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.truncate import cli as truncate_cli
from ext_proc.truncate.client import EmbeddingClient, EmbeddingWorkerProcess

DATA = Path(__file__).parents[1] / "data"

POLICY = """
profiles:
  default:
    max_model_len: 32768
    # images cost 1 token here, so that an image-only question fits the small budget
    media: {tokens_per_image: 1}
    truncation:
      enabled: true
      budget_tokens: {high: 120}
      keep_last_turns: 1
      deadline_ms: 5000
"""

TOPICS = [
    ("Which ryokan in Kyoto near Gion has a private onsen?", "Gion Hatanaka, by Yasaka Shrine."),
    ("How do I undo my last git commit?", "git reset --soft HEAD~1 keeps your changes staged."),
    ("What is a good low-light houseplant?", "A ZZ plant or a snake plant tolerates shade."),
    ("How can I fix a dripping kitchen faucet?", "Replace the cartridge or its worn O-rings."),
    ("Explain compound interest briefly.", "Interest earns interest: growth is exponential."),
    ("What stretches help a stiff lower back?", "Cat-cow, child's pose and knee-to-chest."),
    ("How long should I boil an egg?", "Nine to twelve minutes for a firm yolk."),
]
QUESTION = "Is dinner at that inn near the shrine vegetarian-friendly?"


def chat_body(max_tokens: int = 512) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for user, assistant in TOPICS:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    msgs.append({"role": "user", "content": QUESTION})
    return {"model": "m", "messages": msgs, "max_tokens": max_tokens}


def _snapshot(usage: float) -> PoolSnapshot:
    backend = BackendSignals(url="u", kv_cache_usage=usage, num_requests_waiting=3)
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


# 100 × (0.40 × 0.97 + 0.25 × 3/8) / 0.65 = 74 (no PCIe data: its weight drops out) → high
HIGH = _snapshot(0.97)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sock = str(tmp_path_factory.mktemp("embed") / "embed.sock")
    proc = EmbeddingWorkerProcess(sock, echo_stderr=False)
    proc.start()
    try:
        proc.wait_ready(180)
        yield sock
    finally:
        proc.stop()


def _pipeline(policy_text: str = POLICY) -> tuple[Pipeline, Route]:
    pipeline = Pipeline(parse_policy(policy_text), lambda _pool: HIGH)
    return pipeline, pipeline.router.resolve([])


def _judge(pipeline: Pipeline, route: Route, body: bytes, adapter: Any = OPENAI_CHAT) -> Any:
    facts = RequestFacts(adapter=adapter, priority="critical")
    verdict = pipeline.on_body(route, facts, body)
    assert verdict is not None and verdict.pending is not None, verdict

    async def finish() -> BodyVerdict:
        try:
            return await finish_truncation(pipeline, route, facts, verdict)
        finally:
            if isinstance(pipeline.similarity, EmbeddingClient):
                await pipeline.similarity.close()

    return asyncio.run(finish())


def _sent(verdict: BodyVerdict) -> dict[str, Any]:
    assert isinstance(verdict.outcome, Continue) and verdict.outcome.body is not None
    sent: dict[str, Any] = json.loads(verdict.outcome.body)
    return sent


def test_semantic_truncation_keeps_the_related_turn_and_lowers_the_input(worker: str) -> None:
    pipeline, route = _pipeline()
    pipeline.similarity = EmbeddingClient(worker)
    body = json.dumps(chat_body()).encode()
    done = _judge(pipeline, route, body)
    assert isinstance(done.decision, Truncated)
    assert done.decision.mode == "semantic" and done.decision.fallback == ""
    sent = _sent(done)
    contents = [m["content"] for m in sent["messages"]]
    assert contents[0] == "You are helpful."
    assert contents[-1] == QUESTION
    assert TOPICS[0][0] in contents  # the ryokan turn, six turns back
    assert TOPICS[-1][0] in contents  # keep_last_turns: 1
    headers = dict(done.outcome.headers)
    assert headers["x-ice-decision"] == "truncate"
    assert headers["x-ice-truncated"].startswith(f"messages={done.decision.dropped_messages};")
    assert done.features.input_tokens <= 120


def test_a_late_worker_means_recency_with_fallback_deadline(worker: str) -> None:
    pipeline, route = _pipeline(POLICY.replace("deadline_ms: 5000", "deadline_ms: 1"))
    pipeline.similarity = EmbeddingClient(worker)
    body = chat_body()
    body["messages"][1]["content"] += f" (uncached {time.time_ns()})"  # a cold embedding
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert isinstance(done.decision, Truncated)
    assert (done.decision.mode, done.decision.fallback) == ("recency", "deadline")
    assert "fallback=deadline" in dict(done.outcome.headers)["x-ice-truncated"]


def test_no_worker_means_recency_with_fallback_unavailable(tmp_path: Path) -> None:
    pipeline, route = _pipeline()
    pipeline.similarity = EmbeddingClient(str(tmp_path / "nobody.sock"))
    done = _judge(pipeline, route, json.dumps(chat_body()).encode())
    assert isinstance(done.decision, Truncated)
    assert (done.decision.mode, done.decision.fallback) == ("recency", "unavailable")
    contents = [m["content"] for m in _sent(done)["messages"]]
    assert TOPICS[0][0] not in contents  # recency keeps the newest turns only


def test_an_exactly_counted_request_is_recounted_exactly_after_truncation(tmp_path: Path) -> None:
    text = POLICY + "tokenizers:\n  m: {model_dir: vllm_cpu/tokenizer}\n"
    pipeline = Pipeline(parse_policy(text, base_dir=DATA), lambda _pool: HIGH)
    route = pipeline.router.resolve([])
    pipeline.similarity = EmbeddingClient(str(tmp_path / "nobody.sock"))  # recency
    body = chat_body()
    first = pipeline.on_body(route, RequestFacts(adapter=OPENAI_CHAT), json.dumps(body).encode())
    assert first is not None and first.features is not None
    assert first.features.input_tokens_source == "exact"
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert isinstance(done.decision, Truncated) and done.features is not None
    counter = pipeline.counters.counter_for("m") if pipeline.counters else None
    assert counter is not None
    sent_tokens = counter.count_request(OPENAI_CHAT.name, _sent(done))
    assert done.features.input_tokens == sent_tokens
    assert done.features.input_tokens_source == "exact"
    assert done.decision.saved_tokens == first.features.input_tokens - sent_tokens
    headers = dict(done.outcome.headers)
    assert f";tokens={done.decision.saved_tokens};" in headers["x-ice-truncated"]


def test_must_keep_overflow_is_a_400_in_the_anthropic_format() -> None:
    pipeline, route = _pipeline()
    body = {
        "model": "m",
        "max_tokens": 16,
        "system": "s",
        "messages": [
            {"role": "user", "content": "older question"},
            {"role": "assistant", "content": "older answer"},
            {"role": "user", "content": "old question"},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "long " * 2000},
        ],
    }
    done = _judge(pipeline, route, json.dumps(body).encode(), ANTHROPIC_MESSAGES)
    assert isinstance(done.decision, Reject) and done.decision.status == 400
    assert isinstance(done.outcome, Respond)
    err = json.loads(done.outcome.body)
    assert err["type"] == "error"
    assert err["error"]["code"] == "truncation_budget_exceeded"


def test_best_effort_overflow_sends_only_what_must_stay() -> None:
    pipeline, route = _pipeline(POLICY + "      on_overflow: best_effort\n")
    body = chat_body()
    body["messages"][-1]["content"] = "long " * 2000
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert isinstance(done.decision, Truncated) and done.decision.mode == "must_keep"
    roles = [m["role"] for m in _sent(done)["messages"]]
    assert roles == ["system", "user", "assistant", "user"]


def test_a_truncated_request_is_downgraded_too_when_its_output_does_not_fit() -> None:
    text = POLICY.replace(
        "max_model_len: 32768", "max_model_len: 400\n    output_buffer_tokens: 64"
    )
    pipeline, route = _pipeline(text)
    done = _judge(pipeline, route, json.dumps(chat_body(max_tokens=5000)).encode())
    assert isinstance(done.decision, Truncated)
    assert isinstance(done.decision.then, Downgrade)
    sent = _sent(done)
    assert sent["max_tokens"] == done.decision.then.max_tokens < 5000
    headers = dict(done.outcome.headers)
    assert headers["x-downgraded"] == "true" and headers["x-ice-original-max-tokens"] == "5000"


def test_a_heavy_body_judged_in_the_helper_process_still_truncates(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: HIGH)
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="critical")
    body = chat_body()
    body["messages"][2]["content"] = [{"type": "text", "text": "x"}] * 400  # many containers
    raw = json.dumps(body).encode()
    offload = Offload(str(policy_file), pipeline.max_body_bytes, heavy_containers=100)
    try:
        assert offload.is_heavy(raw)
        remote = asyncio.run(offload.on_body(pipeline, route, facts, raw))
    finally:
        offload.close()
    local = pipeline.on_body(route, facts, raw)
    assert remote is not None and remote.pending is not None
    assert remote == local
    done = asyncio.run(finish_truncation(pipeline, route, facts, remote))
    assert isinstance(done.decision, Truncated)  # no worker configured: recency
    assert done.decision.fallback == "unavailable"


def test_ice_truncate_prints_the_body_and_what_it_dropped(
    worker: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps(chat_body()))
    status = truncate_cli.main(["--budget-tokens", "120", "--keep-last-turns", "0", str(request)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "semantic"
    kept = [m["content"] for m in report["body"]["messages"]]
    assert TOPICS[0][0] in kept and kept[-1] == QUESTION
    assert report["dropped"] and all(d["index"] not in report["kept"] for d in report["dropped"])
    assert report["tokens_after"] <= 120
    over = truncate_cli.main(["--budget-tokens", "5", "--recency", str(request)])
    assert over == 2


def test_ice_truncate_recency_matches_the_server_fallback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps(chat_body()))
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    argv = ["--budget-tokens", "120", "--recency", "--body-only", "--policy", str(policy_file)]
    assert truncate_cli.main([*argv, str(request)]) == 0
    body = json.loads(capsys.readouterr().out)
    pipeline, route = _pipeline()  # no worker: recency
    done = _judge(pipeline, route, json.dumps(chat_body()).encode())
    assert _sent(done)["messages"] == body["messages"]


def test_a_single_turn_over_the_budget_is_judged_by_the_rest_of_the_ladder() -> None:
    pipeline, route = _pipeline()
    body = {"model": "m", "messages": [{"role": "user", "content": "long " * 400}]}
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert not isinstance(done.decision, Truncated | Reject)  # nothing to drop: no 400
    assert dict(done.outcome.headers)["x-ice-decision"] == "downgrade"  # high: cap injected


def _well_formed(original: list[dict[str, Any]], sent: list[dict[str, Any]]) -> None:
    """Kept messages are a subsequence of the original, system and the question stay, and
    every kept tool result's call is kept before it."""
    positions = [original.index(m) for m in sent]
    assert positions == sorted(positions)
    assert all(m in sent for m in original if m.get("role") == "system")
    assert sent[-1] == original[-1]
    opened: set[str] = set()
    for m in sent:
        for call in m.get("tool_calls") or []:
            opened.add(call["id"])
        if m.get("role") == "tool" and any(
            m.get("tool_call_id") in (c.get("id") for c in o.get("tool_calls") or [])
            for o in original
        ):
            assert m["tool_call_id"] in opened


def test_bad_input_never_sends_a_corrupted_conversation() -> None:
    pipeline, route = _pipeline()
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    msgs += [{"role": "user", "content": ""}, {"role": "assistant", "content": None}]
    msgs += [{"role": "narrator", "content": "An aside the API does not define."}]
    msgs += [{"role": "tool", "tool_call_id": "ghost", "content": "an orphaned result"}]
    for i, (user, answer) in enumerate(TOPICS):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        msgs += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": answer},
            {"role": "assistant", "content": answer},
        ]
    msgs.append(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}
    )
    body = {"model": "m", "messages": msgs, "max_tokens": 32}
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert isinstance(done.decision, Truncated)
    assert done.decision.fallback == "no_query"  # an image-only question: recency
    sent = _sent(done)["messages"]
    _well_formed(msgs, sent)
    assert {"role": "narrator", "content": "An aside the API does not define."} in sent
    assert len(sent) < len(msgs)


def test_a_context_budget_overflow_is_judged_as_without_truncation() -> None:
    # max_model_len 4096, min_output 600: input (~3,970) > 4096 − 600 triggers the context
    # budget 4096 − 2048 = 2048; the current question alone is ~3,750 tokens, so truncation
    # cannot reach it: the ladder judges the request as it is (a downgrade to the 126 tokens
    # of room left), not a truncation 400.
    text = POLICY.replace("max_model_len: 32768", "max_model_len: 4096\n    min_output_tokens: 600")
    pipeline, route = _pipeline(text.replace("budget_tokens: {high: 120}", "budget_tokens: {}"))
    body = chat_body()
    body["messages"][-1]["content"] = "word " * 3000
    done = _judge(pipeline, route, json.dumps(body).encode())
    assert isinstance(done.decision, Downgrade), done.decision
    assert done.decision.reason == "context_budget"
