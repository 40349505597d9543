"""The output a backend runs for a request: its limit, or what the backend runs without one
(pure).

``backend_output(f, profile)``, tokens per sequence:
- the client's limit (``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` /
  ``sampling_params.max_tokens`` / ``max_new_tokens``) when it sends one;
- else the rule of ``ext_proc.schemas.limits`` for the API and for how the limit is unset
  (absent, or ``null``; ``RequestFeatures.limit_null``): a fixed number (vLLM completions
  absent: 16; SGLang ``/generate`` absent: 128), the rest of the context
  (``REST``: max_model_len − prompt, the shortest prompt's when a body has several, since
  each runs to the end of the context; at least 1), or the server's
  generation-config default when the route names one (``CONFIG_OR_REST``: the profile's
  ``default_output_tokens``) and else the rest of the context;
- the rest of the context when the context length is unknown (no ``max_model_len``): the
  profile's ``min_output_tokens``, as ICE cannot say more (docs/configuration.md asks for
  max_model_len).

Embeddings generate nothing: 0. The ladder judges a request without a limit for this
output and injects a limit whenever what fits is less (``cap_output_tokens``).
"""

from __future__ import annotations

from ext_proc.policy.settings import Profile
from ext_proc.schemas.base import RequestFeatures
from ext_proc.schemas.limits import COMPLETIONS_DEFAULT_MAX_TOKENS, CONFIG_OR_REST, unset_rule

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "backend_output"]


def backend_output(f: RequestFeatures, profile: Profile) -> int:
    """Output tokens per sequence the backend runs for ``f`` (see the module docstring)."""
    if not f.generates:
        return 0
    if f.max_tokens is not None:
        return f.max_tokens
    rule = unset_rule(f.schema, null=f.limit_null)
    if isinstance(rule, int):
        return rule
    if rule == CONFIG_OR_REST and profile.default_output_tokens is not None:
        return profile.default_output_tokens
    if profile.max_model_len is None:
        return profile.min_output_tokens
    # every prompt runs to the end of the context: the shortest runs longest (the others are
    # charged more than they can run, never less)
    return max(1, profile.max_model_len - min(f.prompts))
