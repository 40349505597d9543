"""SageMaker ``/invocations`` (vLLM serves it): a body judged by its shape, as vLLM
dispatches it.

vLLM 0.32 (``vllm/entrypoints/serve/sagemaker/api_router.py``) validates the body against
each request type in turn and serves the first that fits: chat (``messages``), then
completions (``prompt``), then, for pooling models, embeddings (``input``) and the other
pooling requests. ICE follows the same order: a body with ``messages`` is judged as chat,
else one with ``prompt`` as completions, else one with ``input`` as embeddings. A body with
more than one of those keys is a 400 ``ambiguous_invocation``: vLLM serves the first type
whose validation passes, so a chat body that fails validation (a role-less message) would be
served as its ``prompt``. Any other shape (classification, scoring, pooling bodies) is a 400
``unsupported_invocation``: ICE cannot judge it, so it does not reach the backend.

The features keep the inner schema's name (``openai.chat`` …), so the edits (limit fields,
truncation) are that schema's.
"""

from __future__ import annotations

from typing import Any

from ext_proc.media import MediaCost
from ext_proc.schemas.base import DEFAULT_MEDIA, BadRequest, RequestFeatures, SchemaAdapter
from ext_proc.schemas.embeddings import OPENAI_EMBEDDINGS
from ext_proc.schemas.openai import OPENAI_CHAT, OPENAI_COMPLETIONS, openai_error_body

__all__ = ["SAGEMAKER_INVOCATIONS", "invocation_schema"]

# (the key whose presence selects the schema, the schema), in vLLM's order
_ORDER: tuple[tuple[str, SchemaAdapter], ...] = (
    ("messages", OPENAI_CHAT),
    ("prompt", OPENAI_COMPLETIONS),
    ("input", OPENAI_EMBEDDINGS),
)


# Keys that select a request type in vLLM's dispatch: a body with more than one is refused,
# since which type vLLM serves then depends on which validation fails (a chat body with a
# role-less message falls through to completions).
_SHAPE_KEYS = ("messages", "prompt", "prompt_embeds", "input")


def invocation_schema(body: dict[str, Any]) -> SchemaAdapter:
    """The schema an ``/invocations`` body is judged by (see the module docstring)."""
    shapes = [key for key in _SHAPE_KEYS if key in body]
    if len(shapes) > 1:
        raise BadRequest(
            f"An /invocations body must have exactly one of 'messages', 'prompt' or 'input'; "
            f"this one has {', '.join(repr(k) for k in shapes)}, so the server's choice "
            f"between them cannot be judged",
            param=shapes[1],
            code="ambiguous_invocation",
        )
    for key, adapter in _ORDER:
        if key in body:
            return adapter
    raise BadRequest(
        "ICE judges /invocations bodies shaped as chat ('messages'), completions ('prompt') "
        "or embeddings ('input'); this body has none of them",
        param=None,
        code="unsupported_invocation",
    )


class _SageMakerInvocations:
    name = "sagemaker.invocations"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        return invocation_schema(body).features(body, media)

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


SAGEMAKER_INVOCATIONS = _SageMakerInvocations()
