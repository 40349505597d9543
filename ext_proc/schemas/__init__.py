"""Schema adapters: one per inference API, chosen by request path or by the route's policy.

Job: turn a request body into ``RequestFeatures`` and say how to word an error in that API's
own format. Every adapter is pure.

Invariants:
- ``schema_for_path`` knows exactly the judged endpoints (``ADAPTERS``); any other path
  yields ``None``, and ICE answers it with a 404 unless the policy lists it in
  ``passthrough_paths`` (the shipped Envoy configs never forward such a path at all).
- ``SCHEMAS`` names every adapter as the policy spells it (``routes.<name>.schema``), for
  paths whose body differs between servers (SGLang's native ``/generate``).
"""

from __future__ import annotations

from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.base import BadRequest, RequestFeatures, SchemaAdapter
from ext_proc.schemas.embeddings import OPENAI_EMBEDDINGS
from ext_proc.schemas.generate import SGLANG_GENERATE, VLLM_GENERATE
from ext_proc.schemas.invocations import SAGEMAKER_INVOCATIONS
from ext_proc.schemas.openai import OPENAI_CHAT, OPENAI_CHAT_BATCH, OPENAI_COMPLETIONS
from ext_proc.schemas.responses import OPENAI_RESPONSES

__all__ = [
    "ADAPTERS",
    "BY_NAME",
    "OPENAI_CHAT_FALLBACK",
    "READ_ONLY_PATHS",
    "SCHEMAS",
    "BadRequest",
    "RequestFeatures",
    "SchemaAdapter",
    "normal_path",
    "schema_for_path",
]

# The judged endpoints by exact path (after Envoy's normalisation; see docs/endpoints.md).
ADAPTERS: dict[str, SchemaAdapter] = {
    "/v1/chat/completions": OPENAI_CHAT,
    "/v1/completions": OPENAI_COMPLETIONS,
    "/v1/messages": ANTHROPIC_MESSAGES,
    "/v1/responses": OPENAI_RESPONSES,
    "/v1/embeddings": OPENAI_EMBEDDINGS,
    "/v1/chat/completions/batch": OPENAI_CHAT_BATCH,
    "/invocations": SAGEMAKER_INVOCATIONS,
    "/inference/v1/generate": VLLM_GENERATE,
}

# Every adapter by its policy name (routes.<name>.schema).
SCHEMAS: dict[str, SchemaAdapter] = {
    "openai_chat": OPENAI_CHAT,
    "openai_completions": OPENAI_COMPLETIONS,
    "anthropic_messages": ANTHROPIC_MESSAGES,
    "openai_responses": OPENAI_RESPONSES,
    "openai_embeddings": OPENAI_EMBEDDINGS,
    "openai_chat_batch": OPENAI_CHAT_BATCH,
    "sagemaker_invocations": SAGEMAKER_INVOCATIONS,
    "vllm_generate": VLLM_GENERATE,
    "sglang_generate": SGLANG_GENERATE,
}

# Every adapter by its own name (``SchemaAdapter.name``: plain data for the offload helper).
BY_NAME: dict[str, SchemaAdapter] = {a.name: a for a in SCHEMAS.values()}

# Read-only paths ICE lets through without a body (GET/HEAD; see docs/endpoints.md).
READ_ONLY_PATHS = frozenset(("/v1/models", "/health", "/version", "/ping"))

# The error format used when no adapter is known yet (an ICE fault before the path was read).
OPENAI_CHAT_FALLBACK = OPENAI_CHAT


def normal_path(path: str) -> str:
    """An HTTP ``:path`` without its query string and trailing slash."""
    q = path.find("?")
    if q >= 0:
        path = path[:q]
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return path


def schema_for_path(path: str) -> SchemaAdapter | None:
    """The adapter for an HTTP ``:path`` (query string ignored), or None."""
    return ADAPTERS.get(normal_path(path))
