"""A request without an output limit, absent or ``null``, is judged for what its backend runs
(``ext_proc.schemas.limits``, ``ext_proc.policy.output_limit.backend_output``).

One table drives these tests: docs/endpoints.md's "A request without a limit". Its ICE
columns must equal the code's table, and every row's body, sent through the real adapter with
the limit absent and with it ``null``, must be judged for that many tokens (hand-computed:
``rest`` = max_model_len − the prompt ICE counted).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.settings import Profile
from ext_proc.schemas import SCHEMAS, BadRequest, RequestFeatures
from ext_proc.schemas.invocations import SAGEMAKER_INVOCATIONS
from ext_proc.schemas.limits import CONFIG_OR_REST, REFUSED, REST, UNSET_LIMITS, unset_rule

DOC = Path(__file__).resolve().parents[2] / "docs" / "endpoints.md"
PROFILE = Profile(name="p", max_model_len=8192, output_buffer_tokens=512, min_output_tokens=16)
CONFIGURED = replace(PROFILE, default_output_tokens=300)  # a generation config's default
USER = {"role": "user", "content": "hello there"}

_WORDS = {CONFIG_OR_REST: "config|rest", REST: "rest", REFUSED: "400"}


def _doc_rows() -> dict[str, tuple[str, str]]:
    """schema → (ICE absent, ICE null), read from the docs' table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## A request without a limit", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        m = re.match(r"\|[^|]*\(`([a-z_.]+)`\)", line)
        if not m:
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[m.group(1)] = (cells[-2], cells[-1])
    return rows


DOC_ROWS = _doc_rows()


def _word(rule: int | str) -> str:
    return str(rule) if isinstance(rule, int) else _WORDS[rule]


def test_the_docs_table_is_the_codes_table() -> None:
    assert set(DOC_ROWS) == set(UNSET_LIMITS)
    for schema, row in UNSET_LIMITS.items():
        assert DOC_ROWS[schema] == (_word(row.absent), _word(row.null)), schema


# (schema, adapter, a body without its limit, where the limit goes, its name)
BODIES: list[tuple[str, Any, dict[str, Any], str | None, str]] = [
    ("openai.chat", SCHEMAS["openai_chat"], {"messages": [USER]}, None, "max_tokens"),
    (
        "openai.chat",
        SCHEMAS["openai_chat"],
        {"messages": [USER]},
        None,
        "max_completion_tokens",
    ),
    ("openai.chat", SAGEMAKER_INVOCATIONS, {"messages": [USER]}, None, "max_tokens"),
    ("openai.chat_batch", SCHEMAS["openai_chat_batch"], {"messages": [[USER]]}, None, "max_tokens"),
    ("openai.responses", SCHEMAS["openai_responses"], {"input": "hi"}, None, "max_output_tokens"),
    ("openai.completions", SCHEMAS["openai_completions"], {"prompt": "hi"}, None, "max_tokens"),
    ("openai.completions", SAGEMAKER_INVOCATIONS, {"prompt": "hi"}, None, "max_tokens"),
    (
        "vllm.generate",
        SCHEMAS["vllm_generate"],
        {"token_ids": [1, 2, 3], "sampling_params": {"n": 16}},
        "sampling_params",
        "max_tokens",
    ),
    (
        "sglang.generate",
        SCHEMAS["sglang_generate"],
        {"text": "hi", "sampling_params": {"n": 2}},
        "sampling_params",
        "max_new_tokens",
    ),
    (
        "anthropic.messages",
        SCHEMAS["anthropic_messages"],
        {"model": "m", "messages": [USER]},
        None,
        "max_tokens",
    ),
]
IDS = [f"{b[0]}-{b[1].name}-{b[4]}" for b in BODIES]


def _body(base: dict[str, Any], where: str | None, field: str, null: bool) -> dict[str, Any]:
    body = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    if null:
        (body[where] if where else body)[field] = None
    return body


def _expected(word: str, f: RequestFeatures, profile: Profile) -> int:
    rest = 8192 - f.input_tokens
    if word == "rest":
        return rest
    if word == "config|rest":
        return profile.default_output_tokens or rest
    return int(word)


@pytest.mark.parametrize("null", [False, True], ids=["absent", "null"])
@pytest.mark.parametrize("profile", [PROFILE, CONFIGURED], ids=["no-config", "config-300"])
@pytest.mark.parametrize(("schema", "adapter", "base", "where", "field"), BODIES, ids=IDS)
def test_an_unset_limit_is_judged_as_the_table_says(
    schema: str,
    adapter: Any,
    base: dict[str, Any],
    where: str | None,
    field: str,
    profile: Profile,
    null: bool,
) -> None:
    word = DOC_ROWS[schema][1 if null else 0]
    body = _body(base, where, field, null)
    if word == "400":
        with pytest.raises(BadRequest) as e:
            adapter.features(body)
        assert e.value.param == field
        return
    f = adapter.features(body)
    assert (f.schema, f.max_tokens, f.limit_null) == (schema, None, null)
    assert backend_output(f, profile) == _expected(word, f, profile)


def test_null_on_generate_is_sixteen_sequences_of_the_whole_context() -> None:
    """The issue's case: ``n: 16`` with ``max_tokens: null`` on ``/inference/v1/generate`` is
    16 sequences of max_model_len − 3 tokens each, not 16 × 16."""
    f = SCHEMAS["vllm_generate"].features(
        {"token_ids": [1, 2, 3], "sampling_params": {"n": 16, "max_tokens": None}}
    )
    assert (f.sequences, backend_output(f, PROFILE)) == (16, 8189)
    # and the generation config does not shorten it (the engine sets None to the context)
    assert backend_output(f, CONFIGURED) == 8189


@pytest.mark.parametrize(
    ("params", "limit", "null", "runs"),
    [
        ([{"max_new_tokens": 9}, {}], 128, False, 128),  # the absent one runs 128
        ([{"max_new_tokens": 900}, {}], 900, False, 900),
        ([{"max_new_tokens": 9}, {"max_new_tokens": None}], None, True, 8192 - 1),
        ([{}, {}], None, False, 128),
        ([{"max_new_tokens": None}, {}], None, True, 8192 - 1),
    ],
    ids=["absent-beats-9", "900-beats-absent", "null-is-rest", "all-absent", "null-and-absent"],
)
def test_sglang_judges_its_largest_element(
    params: list[dict[str, Any]], limit: int | None, null: bool, runs: int
) -> None:
    f = SCHEMAS["sglang_generate"].features({"text": ["a", "b"], "sampling_params": params})
    assert (f.max_tokens, f.limit_null) == (limit, null)
    assert backend_output(f, PROFILE) == runs  # "a": one token by the estimate


def test_chat_null_beside_a_value_is_the_value() -> None:
    f = SCHEMAS["openai_chat"].features(
        {"messages": [USER], "max_completion_tokens": None, "max_tokens": 40}
    )
    assert (f.max_tokens, f.limit_null) == (40, False)


def test_an_unknown_schema_is_judged_to_the_end_of_the_context() -> None:
    assert unset_rule("some.future_api", null=False) == REST


def test_every_prompt_of_a_batch_runs_to_the_end_of_the_context() -> None:
    """A batch without a limit: each conversation runs max_model_len − its own prompt, so the
    shortest one's output is what a sequence may run (the longer are charged more, never
    less)."""
    long_turn = {"role": "user", "content": "word " * 4000}
    f = SCHEMAS["openai_chat_batch"].features({"messages": [[long_turn], [USER]]})
    assert len(f.prompts) == 2 and f.input_tokens == max(f.prompts) > min(f.prompts)
    assert backend_output(f, PROFILE) == 8192 - min(f.prompts)
