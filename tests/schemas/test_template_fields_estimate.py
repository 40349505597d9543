"""Everything the chat template renders is counted by the estimate (issue 30, item 6).

RAG ``documents`` (top level or in ``chat_template_kwargs``), an assistant's ``reasoning`` /
``reasoning_content`` (Qwen3-style templates put it back into the prompt) and the text of
other ``chat_template_kwargs`` reach the prompt; the exact counter (``ext_proc.tokencount``)
already hands them to the template, so the estimate must count them too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ext_proc.admit.outcome import Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import ADAPTERS
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.openai import OPENAI_CHAT, OPENAI_CHAT_BATCH
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.tokencount import ExactCounter, TokenizerSpec

TOKENIZER_DIR = Path(__file__).parents[1] / "data" / "vllm_cpu" / "tokenizer"
# A Qwen3-style template: documents first, an assistant's reasoning_content in <think>.
TEMPLATE = """\
{%- if documents %}{%- for d in documents %}<|im_start|>document
{{ d.title if d.title else '' }}
{{ d.text }}<|im_end|>
{% endfor %}{%- endif %}
{%- if system_hint %}<|im_start|>system
{{ system_hint }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{%- if m.role == 'assistant' and m.reasoning_content %}
<think>
{{ m.reasoning_content }}
</think>
{%- endif %}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""
TEXT = ("The memory of the cache holds blocks of tokens; why it fills is the question. " * 800)[
    :60_000
]
BASE = [{"role": "user", "content": "hi"}]
AS_MESSAGE = {"messages": [*BASE, {"role": "user", "content": TEXT}]}
FIELDS: dict[str, dict[str, Any]] = {
    "documents": {"messages": BASE, "documents": [{"title": "t", "text": TEXT}]},
    "kwargs_documents": {
        "messages": BASE,
        "chat_template_kwargs": {"documents": [{"text": TEXT}]},
    },
    "reasoning": {"messages": [*BASE, {"role": "assistant", "content": "", "reasoning": TEXT}]},
    "reasoning_content": {
        "messages": [*BASE, {"role": "assistant", "content": "", "reasoning_content": TEXT}]
    },
    "kwargs_text": {"messages": BASE, "chat_template_kwargs": {"system_hint": TEXT}},
}


def estimate(body: dict[str, Any]) -> int:
    return OPENAI_CHAT.features(body).input_tokens


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_text_in_a_rendered_field_counts_at_least_as_the_same_text_in_a_message(
    field: str,
) -> None:
    assert estimate(FIELDS[field]) >= estimate(AS_MESSAGE)


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> ExactCounter:
    path = tmp_path_factory.mktemp("template") / "qwen3ish.jinja"
    path.write_text(TEMPLATE)
    return ExactCounter.load(TokenizerSpec.from_model_dir(TOKENIZER_DIR, chat_template=path))


# reasoning_content alone is dropped by vLLM (it copies ``reasoning`` into both keys), so
# the exact count does not see it; the estimate counts it anyway (other servers render it).
EXACT_FIELDS = sorted(set(FIELDS) - {"reasoning_content"})


@pytest.mark.parametrize("field", EXACT_FIELDS)
def test_the_estimate_counts_a_rendered_field_as_the_exact_count_does(
    counter: ExactCounter, field: str
) -> None:
    """What the field adds, by the estimate and by the exact count, in the same proportion
    as the same text in a message (the tokenizer's own ratio to the estimate aside)."""
    none = {"messages": BASE}

    def added(body: dict[str, Any]) -> tuple[int, int]:
        exact = counter.count_request("openai.chat", body) - counter.count_request(
            "openai.chat", none
        )
        return estimate(body) - estimate(none), exact

    est_field, exact_field = added(FIELDS[field])
    est_message, exact_message = added(AS_MESSAGE)
    assert exact_field >= exact_message * 0.99  # the template renders it: the exact count sees it
    assert est_field / exact_field >= est_message / exact_message * 0.99


def test_batch_chat_counts_documents_in_every_conversation() -> None:
    body = {"messages": [BASE, BASE], "documents": [{"text": TEXT}]}
    features = OPENAI_CHAT_BATCH.features(body)
    assert min(features.prompt_tokens) >= estimate(AS_MESSAGE)


def test_anthropic_messages_count_documents_and_template_kwargs() -> None:
    base = {"messages": BASE, "max_tokens": 5}
    plain = ANTHROPIC_MESSAGES.features(base).input_tokens
    for extra in ({"documents": [{"text": TEXT}]}, {"chat_template_kwargs": {"hint": TEXT}}):
        got = ANTHROPIC_MESSAGES.features({**base, **extra}).input_tokens
        assert got - plain >= estimate(AS_MESSAGE) - estimate({"messages": BASE})


def test_a_user_messages_reasoning_is_not_rendered_and_not_counted_but_a_repeat_is_refused() -> (
    None
):
    user = {"messages": [{"role": "user", "content": "hi", "reasoning": TEXT}]}
    assert estimate(user) < 100
    repeated = b'{"messages": [{"role": "assistant", "reasoning": "a", "reasoning": "b"}]}'
    p = Pipeline(parse_policy("{}"), lambda _pool: None)
    verdict = p.on_body(p.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), repeated)
    assert verdict is not None and isinstance(verdict.outcome, Respond)
    assert json.loads(verdict.outcome.body)["error"]["code"] == "duplicate_key"


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_60k_character_field_with_max_tokens_7000_is_refused_like_the_same_message(
    field: str,
) -> None:
    policy = parse_policy("profiles: {default: {max_model_len: 8192, output_buffer_tokens: 512}}")
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    p = Pipeline(policy, lambda _pool: snap)
    facts = RequestFacts(adapter=ADAPTERS["/v1/chat/completions"])
    codes = []
    for body in (AS_MESSAGE, FIELDS[field]):
        raw = json.dumps({"model": "m", "max_tokens": 7000, **body}).encode()
        verdict = p.on_body(p.router.resolve([]), facts, raw)
        assert verdict is not None and isinstance(verdict.outcome, Respond)
        assert verdict.outcome.status == 400
        codes.append(json.loads(verdict.outcome.body)["error"]["code"])
    assert codes == ["context_length_exceeded"] * 2
