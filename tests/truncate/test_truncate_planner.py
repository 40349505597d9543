"""The truncation plan: must-keep first, then by similarity (or recency) within the budget;
the edited body keeps every kept message byte for byte."""

from __future__ import annotations

import json
from typing import Any

from ext_proc.truncate.planner import Overflow, Plan, PlanRules, apply_plan, plan_truncation
from ext_proc.truncate.units import Conversation, TurnRules, Unit, conversation_of


def _conv(tokens: list[int], keeps: list[str | None]) -> Conversation:
    units = tuple(
        Unit(indexes=(k,), tokens=t, texts=(f"m{k}",), keep=keep)
        for k, (t, keep) in enumerate(zip(tokens, keeps, strict=True))
    )
    return Conversation("openai.chat", "q", units, fixed_tokens=3, message_count=len(units))


# five droppable units of 100 tokens, then the current turn (50); fixed 3 → total 553
CONV = _conv([100, 100, 100, 100, 100, 50], [None, None, None, None, None, "current"])


def test_semantic_keeps_the_most_similar_units_that_fit() -> None:
    sims = [0.9, 0.1, 0.5, 0.2, 0.3, 1.0]
    plan = plan_truncation(CONV, 253, sims, PlanRules(threshold=0.4))
    assert isinstance(plan, Plan)
    # must: 3 + 50 = 53; room 200 → units 0 (0.9) and 2 (0.5)
    assert plan.kept_units == (0, 2, 5)
    assert plan.dropped_messages == 3
    assert plan.saved_tokens == 300
    assert plan.tokens_after == 253
    assert plan.mode == "semantic"


def test_fill_by_recency_after_the_units_above_the_threshold() -> None:
    sims = [0.9, 0.1, 0.5, 0.2, 0.3, 1.0]
    plan = plan_truncation(CONV, 253, sims, PlanRules(threshold=0.8, fill="recency"))
    assert isinstance(plan, Plan)
    # above 0.8: unit 0; then newest first: unit 4
    assert plan.kept_units == (0, 4, 5)


def test_recency_keeps_the_newest_units_when_there_are_no_similarities() -> None:
    plan = plan_truncation(CONV, 253, None, PlanRules())
    assert isinstance(plan, Plan)
    assert plan.kept_units == (3, 4, 5)
    assert plan.mode == "recency"


def test_a_unit_too_large_is_skipped_and_smaller_ones_still_fill() -> None:
    conv = _conv([30, 300, 40, 50], [None, None, None, "current"])
    sims = [0.2, 0.9, 0.1, 1.0]
    plan = plan_truncation(conv, 130, sims, PlanRules())
    assert isinstance(plan, Plan)
    # must 53; unit 1 (300) does not fit; unit 0 (30) → 83; unit 2 (40) → 123
    assert plan.kept_units == (0, 2, 3)
    assert plan.tokens_after == 123


def test_overflow_when_the_must_keep_units_alone_exceed_the_budget() -> None:
    conv = _conv([100, 500], [None, "current"])
    result = plan_truncation(conv, 400, [0.5, 1.0], PlanRules())
    assert result == Overflow(must_keep_tokens=503, budget_tokens=400)


def test_placeholders_count_against_the_budget_and_give_back_the_lowest_ranked_unit() -> None:
    sims = [0.9, 0.1, 0.5, 0.2, 0.3, 1.0]
    # "[4 earlier messages omitted]" is 28 characters: 4 + ceil(28 / 4) = 11 tokens a run
    text = "[{messages} earlier messages omitted]"
    plan = plan_truncation(CONV, 253, sims, PlanRules(threshold=0.4, placeholder=text))
    assert isinstance(plan, Plan)
    # 0 and 2 would leave two runs (22 tokens): 253 + 22 > 253 → unit 2 goes back;
    # kept 0 + current: one run of 4 messages (11 tokens) → 153 + 11 = 164
    assert plan.kept_units == (0, 5)
    assert plan.tokens_after == 164
    assert plan.saved_tokens == 553 - 164
    assert [(r.before, r.messages) for r in plan.runs] == [(5, 4)]


def _chat(n_turns: int) -> bytes:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 40})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "y" * 40})
    msgs.append({"role": "user", "content": "final?"})
    # unusual spacing and an unknown field: both must survive
    return (
        b'{"model":"m",  "messages": ['
        + b",\n  ".join(json.dumps(m, ensure_ascii=False).encode() for m in msgs)
        + b'], "x_vendor": {"keep": [1, 2.50]}, "max_tokens": 7}'
    )


def test_apply_plan_keeps_kept_messages_byte_for_byte_and_every_other_field() -> None:
    body = _chat(4)
    values = json.loads(body)
    conv = conversation_of("openai.chat", values, TurnRules(keep_last_turns=1))
    plan = plan_truncation(conv, conv.total_tokens - 1, None, PlanRules())
    assert isinstance(plan, Plan) and plan.changed
    out = apply_plan(body, plan)
    new = json.loads(out)
    assert new["messages"] == [values["messages"][i] for i in plan.kept_messages]
    assert out.startswith(b'{"model":"m",  "messages": [')
    assert out.endswith(b'], "x_vendor": {"keep": [1, 2.50]}, "max_tokens": 7}')
    for i in plan.kept_messages:
        raw = json.dumps(values["messages"][i], ensure_ascii=False).encode()
        assert raw in out


def test_apply_plan_inserts_one_placeholder_per_dropped_run() -> None:
    body = _chat(4)
    values = json.loads(body)
    conv = conversation_of("openai.chat", values, TurnRules(keep_last_turns=1))
    rules = PlanRules(placeholder="[{messages} messages omitted]")
    plan = plan_truncation(conv, conv.total_tokens - 40, None, rules)
    assert isinstance(plan, Plan)
    new = json.loads(apply_plan(body, plan))
    roles = [m["role"] for m in new["messages"]]
    assert roles[0] == "system"
    assert new["messages"][1] == {
        "role": "system",
        "content": f"[{plan.runs[0].messages} messages omitted]",
    }
    assert roles[2:] == ["user", "assistant"] * (len(roles[2:]) // 2) + ["user"] * (
        len(roles[2:]) % 2
    )


def test_anthropic_placeholders_are_user_messages_before_a_kept_turn() -> None:
    msgs: list[dict[str, Any]] = []
    for i in range(4):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 40})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "y" * 40})
    msgs.append({"role": "user", "content": "final?"})
    values = {"system": "s", "max_tokens": 5, "messages": msgs}
    body = json.dumps(values).encode()
    conv = conversation_of("anthropic.messages", values, TurnRules(keep_last_turns=1))
    plan = plan_truncation(conv, conv.total_tokens - 40, None, PlanRules(placeholder="[cut]"))
    assert isinstance(plan, Plan)
    new = json.loads(apply_plan(body, plan))
    assert new["messages"][0] == {"role": "user", "content": "[cut]"}
    assert new["system"] == "s"
