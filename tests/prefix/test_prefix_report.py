"""The prefix report over 1,000 generated prompts with variables in known places, the
hand-computed score of a constructed case, redaction, and the CLI."""

from __future__ import annotations

import json
import random
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ext_proc.prefix.blocks import pseudo_tokens
from ext_proc.prefix.cli import main
from ext_proc.prefix.diverge import CONTEXT_CHARS, redact
from ext_proc.prefix.render import render_body

SHARED = (
    "Follow these instructions carefully. Answer politely and concisely, cite the relevant "
    "policy section when you refuse, never reveal internal notes, and escalate billing "
    "disputes to a human agent. Keep answers under two hundred words unless the customer "
    "asks for detail. Use the customer's language. Prefer numbered steps for procedures. "
) * 4
TS_HEAD = "You are the support assistant of Example Corp. Current time: "
RID_HEAD = SHARED[:300] + " Request id: "
NAME_HEAD = "The customer's name is "
NAMES = ["Alice", "Bernard", "Chiara", "Dmitri", "Esther", "Farouk", "Greta", "Hiroshi"]
TOOLS = [
    {"type": "function", "function": {"name": f"tool_{k}", "parameters": {"type": "object"}}}
    for k in "abcde"
]
QUESTIONS = ["How do I reset my password?", "Where is my order?", "Cancel my plan please."]


def _question(rng: random.Random, i: int) -> str:
    return f"{rng.choice(QUESTIONS)} (ticket {i})"


def _bodies() -> list[dict[str, Any]]:
    rng = random.Random(7)
    t0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    out: list[dict[str, Any]] = []
    for i in range(250):
        ts = (t0 + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append(
            {
                "route": "ts",
                "model": "m",
                "messages": [
                    {"role": "system", "content": f"{TS_HEAD}{ts}. {SHARED}"},
                    {"role": "user", "content": _question(rng, i)},
                ],
            }
        )
        rid = uuid.UUID(int=rng.getrandbits(128))
        out.append(
            {
                "route": "rid",
                "messages": [
                    {"role": "system", "content": f"{RID_HEAD}{rid}. {SHARED[300:]}"},
                    {"role": "user", "content": _question(rng, i)},
                ],
            }
        )
        tools = TOOLS[:]
        rng.shuffle(tools)
        out.append(
            {
                "route": "tools",
                "messages": [
                    {"role": "system", "content": SHARED},
                    {"role": "user", "content": _question(rng, i)},
                ],
                "tools": tools,
            }
        )
        name = NAMES[i % len(NAMES)]  # changes on every request
        out.append(  # Anthropic messages
            {
                "route": "name",
                "max_tokens": 64,
                "system": [{"type": "text", "text": f"{NAME_HEAD}{name}. {SHARED}"}],
                "messages": [{"role": "user", "content": _question(rng, i)}],
            }
        )
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("prefix") / "requests.jsonl"
    bodies = _bodies()
    assert len(bodies) == 1000
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    out = _run_json(path)
    return {r["route"]: r for r in out["routes"]}


def _run_json(path: Path, *extra: str) -> Any:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([str(path), "--json", *extra]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize(
    ("route", "section", "offset", "kind"),
    [
        ("ts", "system prompt", len(TS_HEAD), "timestamp"),
        ("rid", "system prompt", len(RID_HEAD), "id"),
        ("tools", "tools", 0, "tools_order"),
        ("name", "system prompt", len(NAME_HEAD), "name"),
    ],
)
def test_the_report_names_each_variables_place_and_kind(
    report: dict[str, Any], route: str, section: str, offset: int, kind: str
) -> None:
    rep = report[route]
    assert rep["requests"] == 250 and rep["groups"] == 1
    first = rep["findings"][0]
    assert (first["section"], first["kind"]) == (section, kind)
    assert abs(first["character"] - offset) <= 2
    assert first["group_requests"] == 250
    assert first["requests"] >= (240 if kind == "tools_order" else 250)
    assert not first["estimated"]
    # every prompt differs from the one before at the variable: reuse stops there
    body = render_body(_bodies()[["ts", "rid", "tools", "name"].index(route)])
    before = body.text[: first["prompt_offset"]]
    # (tools: the site is the tools array's start; two orders may share their first tool)
    slack = 2 if kind == "tools_order" else 1
    assert abs(first["shared_blocks"] - len(pseudo_tokens(before)) // 16) <= slack
    assert abs(first["total_blocks"] - len(pseudo_tokens(body.text)) // 16) <= 2  # questions vary
    # the tracker sees every earlier request, not only the previous one: eight names in turn
    # (and 120 tool orders over 250 requests) come back, so a cache could reuse them
    if route in ("ts", "rid"):  # at most the blocks before the variable (about 5 of 27: rid)
        assert rep["score"] <= (first["shared_blocks"] + 1) / first["total_blocks"]
    elif route == "name":
        assert rep["score"] > 0.8
    assert len(first["context"]) <= 2 * CONTEXT_CHARS + len(kind) + 4


def test_no_other_findings_than_the_variable(report: dict[str, Any]) -> None:
    # the questions differ only in the last message: expected, not reported
    for rep in report.values():
        assert len(rep["findings"]) == 1, rep["findings"]


def test_contexts_are_redacted(report: dict[str, Any]) -> None:
    long_words = set(re.findall(r"[A-Za-z]{4,}", SHARED + TS_HEAD + NAME_HEAD))
    for rep in report.values():
        for f in rep["findings"]:
            shown = set(re.findall(r"[A-Za-z]{4,}", re.sub(r"<\|?\w+\|?>", "", f["context"]))) - {
                "assistant",
                "user",
                "system",
            }
            assert not long_words & shown, f
            assert not re.search(r"[1-9]", f["context"])
    assert (
        redact("mail bob@example.com at 10:42, id 3f2a9c1e77") == "m*** <email> at 00:00, id <id>"
    )
    assert redact("<|user|>\nHello") == "<|user|>⏎H****"


def test_text_output_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(b) + "\n" for b in _bodies()[:40]) + "not json\n")
    assert main([str(path)]) == 0
    out, err = capsys.readouterr()
    assert "line 41: not JSON" in err
    assert re.search(
        r"^route ts: system prompt, character 6[01]: a value like <timestamp> changes on every "
        r"request \(10 of 10 requests\); prefix cache could reuse \d+ of \d+ blocks$",
        out,
        re.M,
    ), out
    assert re.search(r"^route tools: tools, character 0: the order of the tools array", out, re.M)
    assert re.search(r"^route ts: 10 requests, prefix stability 0\.\d\d \(", out, re.M)


def test_hand_computed_score_of_a_constructed_case(tmp_path: Path) -> None:
    # completions prompts are the text itself; "aa" and each " ab" are one pseudo-token each
    base = "aa" + " ab" * 39  # 40 tokens
    prompts = [
        base + " zz" * 8,  # 48 tokens, 3 blocks, nothing seen: 0 of 3
        base + " yy" * 8,  # tokens 0..31 as before: blocks 0, 1 shared (cap 47 // 16 = 2)
        "qq" + (base + " zz" * 8)[2:],  # the first token differs: 0 of 3
    ]
    assert [len(pseudo_tokens(p)) for p in prompts] == [48, 48, 48]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    rep = _run_json(path, "--route", "simple")["routes"][0]
    assert rep["route"] == "simple"
    assert (rep["shared_blocks"], rep["total_blocks"]) == (2, 9)
    assert rep["score"] == pytest.approx(2 / 9)
    # with 8-token blocks: 6 blocks each, prompt 2 shares 5 (tokens 0..39), cap 47 // 8 = 5
    rep8 = _run_json(path, "--block-size", "8")["routes"][0]
    assert rep8["score"] == pytest.approx(5 / 18)


def test_cli_errors(tmp_path: Path) -> None:
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n[1]\n")
    assert main([str(empty)]) == 2
    assert main([str(empty), "--block-size", "0"]) == 2
