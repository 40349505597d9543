"""Schema adapters: one per inference API, chosen by request path.

Job: turn a request body into ``RequestFeatures`` and say how to edit its output-token limit
and how to word an error in that API's own format. Every adapter is pure.

Invariant: an unknown path yields ``None`` from ``adapter_for_path``: ICE passes such
requests through untouched.
"""

from __future__ import annotations

from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.base import BadRequest, RequestFeatures, SchemaAdapter
from ext_proc.schemas.openai import OPENAI_CHAT, OPENAI_COMPLETIONS

__all__ = [
    "ADAPTERS",
    "OPENAI_CHAT_FALLBACK",
    "BadRequest",
    "RequestFeatures",
    "SchemaAdapter",
    "adapter_for_path",
]

ADAPTERS: dict[str, SchemaAdapter] = {
    "/v1/chat/completions": OPENAI_CHAT,
    "/v1/completions": OPENAI_COMPLETIONS,
    "/v1/messages": ANTHROPIC_MESSAGES,
}


# The error format used when no adapter is known yet (an ICE fault before the path was read).
OPENAI_CHAT_FALLBACK = OPENAI_CHAT


def adapter_for_path(path: str) -> SchemaAdapter | None:
    """The adapter for an HTTP ``:path`` (query string ignored), or None."""
    q = path.find("?")
    if q >= 0:
        path = path[:q]
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return ADAPTERS.get(path)
