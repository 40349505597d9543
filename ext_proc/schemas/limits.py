"""What a backend runs when a request sets no output limit: one table, per API, for an
absent limit field and for an explicit ``null`` (pure data).

Each rule is a number of tokens per sequence (the backend's own constant) or one of:
- ``CONFIG_OR_REST``: the server's generation-config default when it names one (the
  profile's ``default_output_tokens``), else the rest of the context, max_model_len − prompt
  (vLLM ``get_max_tokens`` with ``max_tokens=None``);
- ``REST``: the rest of the context whatever the generation config says (vLLM's engine
  ``InputProcessor`` for ``SamplingParams.max_tokens=None``; SGLang's scheduler
  ``init_req_max_new_tokens``, which runs ``None`` to ``max_req_len − input − 1``);
- ``REFUSED``: the backend answers 400 (the adapter refuses it first).

Where the backend runs ``null`` and absent differently, ICE follows the backend: vLLM's
``/inference/v1/generate`` gives an absent ``max_tokens`` the generation config's default
(else the rest of the context) but runs ``null`` to the end of the context; SGLang's
``SamplingParams.max_new_tokens`` defaults to 128 but ``null`` stays ``None`` to the
scheduler. vLLM's completions read ``null`` as absent: 16 (``normalize_null_max_tokens``).
The vLLM rules were run against vLLM 0.32 itself (tests/e2e/test_vllm_unset_limits.py).
The docs' table (docs/endpoints.md, "A request without a limit") is this one with its
sources and SGLang's column; tests/policy/test_unset_limits.py checks that the two agree and
drives the adapters and ``backend_output`` from this table.

Invariant: every generating schema in ``ext_proc.schemas.ADAPTERS`` has a row (an unknown
schema is judged ``REST``, the largest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "CONFIG_OR_REST",
    "REFUSED",
    "REST",
    "SGLANG_DEFAULT_MAX_NEW_TOKENS",
    "UNSET_LIMITS",
    "UnsetLimit",
    "unset_rule",
]

COMPLETIONS_DEFAULT_MAX_TOKENS: Final[int] = 16  # vLLM's and SGLang's CompletionRequest.max_tokens
SGLANG_DEFAULT_MAX_NEW_TOKENS: Final[int] = 128  # SGLang's SamplingParams.max_new_tokens
CONFIG_OR_REST: Final[str] = "config_or_rest"
REST: Final[str] = "rest_of_context"
REFUSED: Final[str] = "refused"

Rule = int | str


@dataclass(frozen=True, slots=True)
class UnsetLimit:
    """One API's rules: the limit field absent, and sent as ``null``."""

    field: str  # the limit field, as the API names it
    absent: Rule
    null: Rule


UNSET_LIMITS: Final[dict[str, UnsetLimit]] = {
    # vLLM ChatCompletionRequest: max_completion_tokens, else max_tokens, both default None
    "openai.chat": UnsetLimit("max_completion_tokens / max_tokens", CONFIG_OR_REST, CONFIG_OR_REST),
    "openai.chat_batch": UnsetLimit(
        "max_completion_tokens / max_tokens", CONFIG_OR_REST, CONFIG_OR_REST
    ),
    # vLLM ResponsesRequest.max_output_tokens: None → get_max_tokens
    "openai.responses": UnsetLimit("max_output_tokens", CONFIG_OR_REST, CONFIG_OR_REST),
    # vLLM CompletionRequest.max_tokens = 16, and its ``normalize_null_max_tokens`` turns a
    # null into that default (seen: 16 tokens, tests/e2e/test_vllm_unset_limits.py)
    "openai.completions": UnsetLimit(
        "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, COMPLETIONS_DEFAULT_MAX_TOKENS
    ),
    # vLLM GenerateRequest: a sampling_params without max_tokens → get_max_tokens(None)
    # (``is_sampling_param_provided``); null → SamplingParams.max_tokens None → the engine's
    # max_model_len − prompt
    "vllm.generate": UnsetLimit("sampling_params.max_tokens", CONFIG_OR_REST, REST),
    # SGLang SamplingParams.max_new_tokens = 128; null → init_req_max_new_tokens: 1 << 30,
    # cut to the context
    "sglang.generate": UnsetLimit(
        "sampling_params.max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS, REST
    ),
    # Anthropic and vLLM's AnthropicMessagesRequest: max_tokens: int, required
    "anthropic.messages": UnsetLimit("max_tokens", REFUSED, REFUSED),
}


def unset_rule(schema: str, *, null: bool) -> Rule:
    """The rule for ``schema``'s request without a limit (``null``: the field sent as null)."""
    row = UNSET_LIMITS.get(schema)
    if row is None:
        return REST
    return row.null if null else row.absent
