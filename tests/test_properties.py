"""Property tests of the pure core (hypothesis): what must hold for every input, not examples.

- ``rawjson``: an edit changes the bytes of the one member it edits and nothing else; the
  result parses to the same document with only that member changed.
- Schema adapters: arbitrary JSON values in every field they read raise only ``BadRequest``
  (the documented 400), never anything else.
- KV arithmetic: more memory never gives fewer blocks, never more blocks than the memory
  holds, and a longer context never gives more concurrency.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.kv import plan_capacity
from ext_proc.kv.geometry import build_geometry
from ext_proc.kv.hfconfig import ModelShape
from ext_proc.schemas import ADAPTERS, BadRequest, rawjson

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        *("model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens"),
        *("max_output_tokens", "n", "best_of", "stream", "tools", "system", "instructions"),
        *("previous_response_id", "text", "input_ids", "token_ids", "sampling_params"),
        *("content_parts", "conversation", "dimensions"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=8), VALUES, max_size=6),
    st.sampled_from(["compact", "spaced", "indented"]),
    st.integers(min_value=0, max_value=10**9),
)
def test_an_edit_changes_only_its_member_and_keeps_every_other_byte(
    doc: dict[str, Any], style: str, limit: int
) -> None:
    doc = {**doc, "max_tokens": 123456789012}  # the member the editor lowers
    if style == "compact":
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    elif style == "spaced":
        text = json.dumps(doc, ensure_ascii=False)
    else:
        text = json.dumps(doc, indent=3, ensure_ascii=True)
    body = text.encode()
    parsed = rawjson.parse_object(body)
    edited = rawjson.replace_value(parsed, "max_tokens", limit)
    start, end = parsed.spans["max_tokens"]
    new_text = edited.decode()
    assert new_text[:start] == text[:start]  # every byte before the member's value
    assert new_text[start + len(str(limit)) :] == text[end:]  # and after it
    assert json.loads(new_text) == {**doc, "max_tokens": limit}

    without = {k: v for k, v in doc.items() if k != "max_tokens"}
    body2 = json.dumps(without, ensure_ascii=False).encode()
    added = rawjson.add_member(rawjson.parse_object(body2), "max_tokens", limit)
    assert json.loads(added) == {**without, "max_tokens": limit}
    assert added.decode().startswith(body2.decode().rstrip("}").rstrip())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=7), st.sampled_from(sorted(ADAPTERS)))
def test_schema_adapters_raise_only_bad_request_on_any_json(doc: dict[str, Any], name: str) -> None:
    adapter = ADAPTERS[name]
    try:
        features = adapter.features(doc)
    except BadRequest as e:
        assert e.code and e.message  # a precise 400
        return
    assert features.input_tokens >= 0
    assert features.sequences >= 1


LLAMA_8B = ModelShape(
    model_type="llama",
    num_layers=32,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    mla=False,
    model_dtype="bfloat16",
    layer_windows=(None,) * 32,
    max_model_len=None,
    max_model_len_source="",
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=2 * 2**21, max_value=2**40),
    st.integers(min_value=0, max_value=2**32),
    st.integers(min_value=1, max_value=2**20),
    st.integers(min_value=0, max_value=2**20),
)
def test_kv_capacity_is_monotone_and_never_exceeds_memory(
    memory: int, more: int, max_model_len: int, longer: int
) -> None:
    g = build_geometry(LLAMA_8B, block_size=16)
    small = plan_capacity(g, max_model_len=max_model_len, available_bytes=memory)
    large = plan_capacity(g, max_model_len=max_model_len, available_bytes=memory + more)
    assert large.num_blocks >= small.num_blocks
    assert small.num_blocks * g.bytes_per_block <= memory  # no block beyond the memory
    assert small.num_blocks == memory // g.bytes_per_block
    long = plan_capacity(g, max_model_len=max_model_len + longer, available_bytes=memory)
    assert long.max_concurrency is not None and small.max_concurrency is not None
    assert long.max_concurrency <= small.max_concurrency
    assert long.fits_max_model_len is not None and small.fits_max_model_len is not None
    assert long.fits_max_model_len <= small.fits_max_model_len


def _chat(turns: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """A chat body: a system prompt, then turns; a True flag makes the assistant call a tool
    whose result follows."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i, (question, answer, calls) in enumerate(turns):
        messages.append({"role": "user", "content": question})
        if calls:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": answer})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": "and now?"})
    return {"model": "m", "messages": messages}


TURN = st.tuples(st.text(max_size=60), st.text(max_size=60), st.booleans())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(TURN, max_size=10),
    st.integers(min_value=0, max_value=600),
    st.none() | st.lists(st.floats(min_value=-1, max_value=1), min_size=12, max_size=12),
    st.integers(min_value=0, max_value=3),
)
def test_truncation_keeps_the_system_prompt_the_question_and_every_call_with_its_result(
    turns: list[tuple[str, str, bool]], budget: int, sims: list[float] | None, keep_last: int
) -> None:
    from ext_proc.truncate.planner import Overflow, PlanRules, apply_plan, plan_truncation
    from ext_proc.truncate.units import TurnRules, conversation_of

    body = _chat(turns)
    conv = conversation_of("openai.chat", body, TurnRules(keep_last_turns=keep_last))
    similarities = None if sims is None else sims[: len(conv.units)]
    if similarities is not None and len(similarities) < len(conv.units):
        similarities = None
    plan = plan_truncation(conv, budget, similarities, PlanRules())
    if isinstance(plan, Overflow):
        assert plan.must_keep_tokens > budget
        return
    assert plan.tokens_after <= max(budget, conv.total_tokens)  # never more than it was given
    if plan.changed:
        assert plan.tokens_after <= budget
    sent = json.loads(apply_plan(json.dumps(body).encode(), plan))["messages"]
    original = body["messages"]
    assert sent[0] == original[0]  # the system prompt
    assert sent[-1] == original[-1]  # the question
    kept_calls = {c["id"] for m in sent for c in (m.get("tool_calls") or [])}
    kept_results = {m["tool_call_id"] for m in sent if m.get("role") == "tool"}
    assert kept_calls == kept_results  # a call never without its result, nor the reverse
    kept = list(plan.kept_messages)
    assert kept == sorted(set(kept))  # kept messages in their order …
    assert sent == [original[i] for i in kept]  # … each unchanged
