"""Conversations as turns: what stays together and what must stay (hand-computed tokens)."""

from __future__ import annotations

from typing import Any

import pytest

from ext_proc.schemas.base import BadRequest
from ext_proc.truncate.units import TurnRules, conversation_of


def _openai_with_tools() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys"},  # 4 + 1 = 5
            {"role": "user", "content": "q1 aaaa"},  # 4 + 2 = 6
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },  # 4 + (1 + 1 + 4) = 10
            {"role": "tool", "tool_call_id": "c1", "content": "r"},  # 5
            {"role": "assistant", "content": "a1"},  # 5
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "q3"},
            {"role": "assistant", "content": "a3"},
            {"role": "user", "content": "q4"},
        ],
    }


def test_openai_turns_group_a_tool_call_with_its_result_and_mark_what_must_stay() -> None:
    conv = conversation_of("openai.chat", _openai_with_tools(), TurnRules(keep_last_turns=1))
    assert [u.indexes for u in conv.units] == [(0,), (1, 2, 3, 4), (5, 6), (7, 8), (9,)]
    assert [u.keep for u in conv.units] == ["system", None, None, "recent", "current"]
    assert [u.tokens for u in conv.units] == [5, 26, 10, 10, 5]
    assert conv.fixed_tokens == 3  # the reply primer
    assert conv.total_tokens == 59
    assert conv.query == "q4"
    assert conv.units[1].texts == ("q1 aaaa", "f({})", "r", "a1")


def test_keep_last_turns_counts_turns_before_the_current_one() -> None:
    conv = conversation_of("openai.chat", _openai_with_tools(), TurnRules(keep_last_turns=2))
    assert [u.keep for u in conv.units] == ["system", None, "recent", "recent", "current"]
    conv0 = conversation_of("openai.chat", _openai_with_tools(), TurnRules(keep_last_turns=0))
    assert [u.keep for u in conv0.units] == ["system", None, None, None, "current"]


def test_a_tool_result_answered_in_a_later_turn_merges_the_turns_between() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "u0"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "x", "function": {"name": "g", "arguments": "1"}}],
            },
            {"role": "user", "content": "u1"},
            {"role": "tool", "tool_call_id": "x", "content": "late"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "u3"},
        ]
    }
    conv = conversation_of("openai.chat", body, TurnRules(keep_last_turns=0))
    assert [u.indexes for u in conv.units] == [(0, 1, 2, 3), (4, 5), (6,)]


def test_an_orphaned_tool_result_stays_inside_its_turn() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "u0"},
            {"role": "tool", "tool_call_id": "nowhere", "content": "orphan"},
            {"role": "user", "content": "u1"},
        ]
    }
    conv = conversation_of("openai.chat", body, TurnRules(keep_last_turns=0))
    assert [u.indexes for u in conv.units] == [(0, 1), (2,)]
    assert conv.units[0].keep is None


def test_anthropic_tool_results_do_not_start_a_turn_and_system_is_outside_messages() -> None:
    body = {
        "system": "be brief",  # 4 + 2 = 6, plus the primer 3 → fixed 9
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}],
            },
            {"role": "assistant", "content": "It rains."},
            {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]},
        ],
    }
    conv = conversation_of("anthropic.messages", body, TurnRules(keep_last_turns=0))
    assert [u.indexes for u in conv.units] == [(0, 1, 2, 3), (4,)]
    assert conv.fixed_tokens == 9
    assert conv.query == "and tomorrow?"
    assert conv.units[0].texts[1] == 'checking\nw({"c": "Oslo"})'
    assert conv.units[0].texts[2] == "rain"


def test_unknown_roles_stay_in_place_as_their_own_unit() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "u0"},
            {"role": "critic", "content": "hmm"},
            {"role": "assistant", "content": "a0"},
            {"role": "user", "content": "u1"},
        ]
    }
    conv = conversation_of("openai.chat", body, TurnRules(keep_last_turns=0))
    assert [(u.indexes, u.keep) for u in conv.units] == [
        ((0, 2), None),
        ((1,), "unknown_role"),
        ((3,), "current"),
    ]


def test_pins_by_first_turns_role_and_name() -> None:
    msgs: list[dict[str, Any]] = []
    for i in range(6):
        msgs.append({"role": "user", "content": f"u{i}"})
        msgs.append({"role": "assistant", "content": f"a{i}"})
    msgs[4]["name"] = "spec"  # turn 2
    msgs.append({"role": "user", "content": "now"})
    rules = TurnRules(keep_last_turns=0, pin_first_turns=1, pin_names=("spec",))
    conv = conversation_of("openai.chat", {"messages": msgs}, rules)
    assert [u.keep for u in conv.units] == [
        "pinned",
        None,
        "pinned",
        None,
        None,
        None,
        "current",
    ]
    by_role = conversation_of(
        "openai.chat", {"messages": msgs}, TurnRules(keep_last_turns=0, pin_roles=("assistant",))
    )
    assert all(u.keep is not None for u in by_role.units)


def test_no_user_message_makes_the_last_unit_current_and_leaves_no_query() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}
    conv = conversation_of("openai.chat", body, TurnRules())
    assert [u.keep for u in conv.units] == ["system", "current"]
    assert conv.query == ""


def test_non_text_parts_are_counted_and_travel_with_their_message() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                ],
            },
            {"role": "assistant", "content": "a cat"},
            {"role": "user", "content": "thanks"},
        ]
    }
    conv = conversation_of("openai.chat", body, TurnRules(keep_last_turns=0))
    assert conv.units[0].non_text_parts == 1
    assert conv.units[0].texts == ("see", "a cat")


def test_messages_that_are_not_objects_are_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        conversation_of("openai.chat", {"messages": ["hi"]}, TurnRules())
