"""The output a backend runs for a request: its limit, or the API's default when it sends
none (pure).

``backend_output(f, profile)``, tokens per sequence:
- the client's limit (``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` /
  ``sampling_params.max_tokens`` / ``max_new_tokens``) when it sends one (the SGLang and
  ``/inference/v1/generate`` adapters already fill their server's default in);
- else the profile's ``default_output_tokens`` when set (a server whose generation config
  names a default);
- else the API's default as vLLM 0.32 applies it
  (``vllm/entrypoints/serve/utils/api_utils.py: get_max_tokens``): chat completions, batch
  chat and the Responses API run to the end of the context, max_model_len − prompt (the
  longest prompt's; at least 1); completions run 16 tokens (``CompletionRequest.max_tokens``);
- when the context length is unknown (no ``max_model_len``), the profile's
  ``min_output_tokens``: ICE cannot say more (docs/configuration.md asks for max_model_len).

Embeddings generate nothing: 0. The ladder judges a request without a limit for this
output and injects a limit whenever what fits is less (``cap_output_tokens``).
"""

from __future__ import annotations

from ext_proc.policy.model import Profile
from ext_proc.schemas.base import RequestFeatures

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "REST_OF_CONTEXT", "backend_output"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vllm CompletionRequest.max_tokens
# APIs whose requests without a limit run to the end of the context window
REST_OF_CONTEXT = frozenset(("openai.chat", "openai.chat_batch", "openai.responses"))


def backend_output(f: RequestFeatures, profile: Profile) -> int:
    """Output tokens per sequence the backend runs for ``f`` (see the module docstring)."""
    if not f.generates:
        return 0
    if f.max_tokens is not None:
        return f.max_tokens
    if profile.default_output_tokens is not None:
        return profile.default_output_tokens
    if f.schema not in REST_OF_CONTEXT:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    if profile.max_model_len is None:
        return profile.min_output_tokens
    return max(1, profile.max_model_len - f.input_tokens)
