"""Semantic history truncation through real Envoy, ICE and its embedding worker, with the
OpenAI and Anthropic SDKs as clients."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from .harness import CHAT, E2E, HIGH, HIGH_SCORE, IDLE, MESSAGES, running_stack

BUDGET_HIGH = 450
PROFILE_EXTRA = f"""\
    truncation:
      enabled: true
      budget_tokens: {{high: {BUDGET_HIGH}, critical: 300}}
      keep_last_turns: 1
      deadline_ms: 3000
"""

SYSTEM = "You are a helpful travel and engineering assistant."
# (user, assistant) turns on unrelated topics; turn 2 is the one the final question needs.
TURNS = [
    (
        "What's a good way to store fresh basil so it doesn't wilt?",
        "Treat basil like cut flowers: trim the stems, stand them in a glass of water at room "
        "temperature and loosely cover the leaves with a plastic bag. Avoid the fridge, where "
        "the leaves blacken within a day or two.",
    ),
    (
        "How do I undo the last git commit but keep my changes?",
        "Run git reset --soft HEAD~1: the commit disappears and its changes stay staged. Use "
        "--mixed instead to keep them unstaged, and never use --hard unless you want them gone.",
    ),
    (
        "Can you recommend a traditional ryokan in Kyoto near Gion with a private onsen bath?",
        "Gion Hatanaka is a classic choice a few steps from Yasaka Shrine; several rooms have "
        "private cypress baths and dinner is a seasonal kaiseki served in your room. Book "
        "two to three months ahead for spring and autumn.",
    ),
    (
        "What's the difference between a Roth IRA and a traditional IRA?",
        "Traditional IRA contributions may be tax-deductible now and withdrawals are taxed "
        "later; Roth contributions are made after tax and qualified withdrawals are tax-free. "
        "Roth IRAs also have no required minimum distributions for the owner.",
    ),
    (
        "My sourdough starter smells like nail polish remover. Is it dead?",
        "No, that acetone smell means it is hungry. Discard most of it and feed it equal "
        "weights of flour and water twice a day for a couple of days; the smell fades as the "
        "yeast and bacteria recover.",
    ),
    (
        "How many sets and reps should a beginner do for strength training?",
        "Three sets of five to eight reps on compound lifts such as squats, deadlifts and "
        "presses, two or three times a week, adding a little weight when all sets feel solid.",
    ),
    (
        "Why does my Python script say ModuleNotFoundError for requests?",
        "The interpreter running the script has no requests package installed. Activate the "
        "right virtual environment or run python -m pip install requests with that same "
        "interpreter, then try again.",
    ),
    (
        "What's a good first houseplant for a dark apartment?",
        "A ZZ plant or a snake plant: both tolerate low light, need water only every two to "
        "three weeks and forgive neglect. Pothos is another easy option that trails nicely.",
    ),
    (
        "How do I fix a dripping kitchen faucet?",
        "Shut off the water under the sink, remove the handle and cartridge, and replace the "
        "worn O-rings or the cartridge itself. Take the old part to the store to match it.",
    ),
    (
        "Summarise the plot of Pride and Prejudice in two sentences.",
        "Elizabeth Bennet and the proud Mr Darcy misjudge each other until letters, scandal and "
        "a rescued sister reveal their true characters. They overcome pride and prejudice and "
        "marry.",
    ),
]
FINAL = "For that inn you suggested near the shrine, is the in-room dinner vegetarian-friendly?"
DEPENDENCY = TURNS[2][0]


def _openai_messages() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for user, assistant in TURNS:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    msgs.append({"role": "user", "content": FINAL})
    return msgs


@pytest.fixture(scope="module")
def tstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(tmp_path_factory.mktemp("truncation"), profile_extra=PROFILE_EXTRA) as e2e:
        yield e2e


@pytest.fixture
def high(tstack: E2E) -> Iterator[E2E]:
    tstack.set_state(HIGH, level="high", score=HIGH_SCORE)
    yield tstack
    tstack.backend("PUT", "/_dev/state", json.dumps(IDLE).encode())
    tstack.wait_pressure("low", "0")


def _contents(body: dict[str, Any]) -> list[str]:
    out = []
    for m in body["messages"]:
        c = m["content"]
        out.append(c if isinstance(c, str) else " ".join(p.get("text", "") for p in c))
    return out


def test_openai_chat_keeps_the_turn_the_question_needs_and_says_so(high: E2E) -> None:
    with openai.OpenAI(base_url=f"{high.base_url}/v1", api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="dev-model",
            messages=_openai_messages(),  # type: ignore[arg-type]
            max_tokens=64,
            extra_headers={"x-priority": "standard"},
        )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ice-decision"] == "truncate"
    shown = raw.headers["x-ice-truncated"]
    assert "mode=semantic" in shown and "fallback" not in shown, shown
    assert raw.headers["x-ice-reason"] == "pressure_budget"
    got = high.only_received()
    assert got.header("x-ice-truncated") == shown  # the backend sees the verdict too
    sent = got.json()
    contents = _contents(sent)
    assert contents[0] == SYSTEM
    assert contents[-1] == FINAL
    assert contents[-3:-1] == list(TURNS[-1])  # keep_last_turns: 1
    assert DEPENDENCY in contents  # found by similarity, 8 turns back
    dropped = int(shown.split(";")[0].split("=")[1])
    assert len(sent["messages"]) == len(_openai_messages()) - dropped > 4
    assert sent["max_tokens"] == 64 and sent["model"] == "dev-model"
    assert high.ice_metric("ice_truncations_total", mode="semantic") >= 1


def test_anthropic_messages_are_truncated_in_whole_turns(high: E2E) -> None:
    msgs: list[dict[str, Any]] = []
    for user, assistant in TURNS:
        msgs += [
            {"role": "user", "content": [{"type": "text", "text": user}]},
            {"role": "assistant", "content": assistant},
        ]
    msgs.append({"role": "user", "content": FINAL})
    with anthropic.Anthropic(base_url=high.base_url, api_key="x", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            model="dev-model",
            system=SYSTEM,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=64,
        )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ice-decision"] == "truncate"
    sent = high.only_received().json()
    assert sent["system"] == SYSTEM
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
    assert DEPENDENCY in _contents(sent)
    assert len(roles) < len(msgs)


def test_must_keep_turns_over_the_budget_get_a_400_in_the_api_format(high: E2E) -> None:
    huge = "word " * (BUDGET_HIGH * 5)
    msgs = [*_openai_messages()[:-1], {"role": "user", "content": huge}]
    reply = high.post(CHAT, {"model": "dev-model", "messages": msgs, "max_tokens": 8})
    assert reply.status == 400
    err = reply.json()["error"]
    assert err["code"] == "truncation_budget_exceeded"
    assert err["param"] == "messages"
    assert reply.header("x-ice-decision") == "reject"
    assert high.received() == []


def test_a_short_conversation_is_not_truncated(high: E2E) -> None:
    body = {"model": "dev-model", "messages": _openai_messages()[-3:], "max_tokens": 8}
    reply = high.post(CHAT, body)
    assert reply.status == 200
    assert reply.header("x-ice-decision") == "pass"
    assert reply.header("x-ice-truncated") is None


def _worker_pids(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"ext_proc.truncate.worker" in cmd and int(stat[1]) == parent:
            pids.append(int(entry.name))
    return pids


def test_a_dead_embedding_worker_means_recency_then_the_worker_comes_back(high: E2E) -> None:
    ice_pid = high.stack.procs["ice"].pid
    (worker,) = _worker_pids(ice_pid)
    os.kill(worker, signal.SIGKILL)
    body = {"model": "dev-model", "messages": _openai_messages(), "max_tokens": 16}
    reply = high.post(CHAT, body)
    assert reply.status == 200
    shown = reply.header("x-ice-truncated") or ""
    assert "mode=recency;fallback=unavailable" in shown, shown
    assert DEPENDENCY not in _contents(high.only_received().json())  # recency lost it
    assert high.ice_metric("ice_truncation_fallbacks_total", reason="unavailable") >= 1
    deadline = time.monotonic() + 120
    while True:  # the supervisor restarts the worker (backoff + model load)
        high.clear_received()
        reply = high.post(CHAT, body)
        if "mode=semantic" in (reply.header("x-ice-truncated") or ""):
            break
        assert time.monotonic() < deadline, high.log_tails()
        time.sleep(0.5)
    assert worker not in _worker_pids(ice_pid)


def test_messages_path_through_envoy_is_the_anthropic_adapter(tstack: E2E) -> None:
    # low pressure: Anthropic requests pass untouched (the truncation rule does not fire)
    body = {"model": "dev-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    reply = tstack.post(MESSAGES, body)
    assert reply.status == 200
    assert reply.header("x-ice-decision") == "pass"
