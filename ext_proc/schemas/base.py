"""What every schema adapter produces and needs.

``RequestFeatures`` are the facts about one request that the evaluator judges; ``BadRequest``
is raised by an adapter when the body breaks its API's contract, carrying the offending
parameter so the error can name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ext_proc.tokens import estimate_text_tokens

__all__ = [
    "MAX_SANE_TOKENS",
    "BadRequest",
    "RequestFeatures",
    "SchemaAdapter",
    "optional_token_limit",
    "text_of_content",
]

# Larger token limits are clamped for arithmetic: no model has a context near 2^53.
MAX_SANE_TOKENS = 2**53


class BadRequest(ValueError):
    """The request breaks its API's contract. ``code`` is machine-readable."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """Facts about one inference request, extracted by a schema adapter."""

    schema: str
    model: str | None
    input_tokens: int
    max_tokens: int | None
    max_tokens_field: str | None
    stream: bool
    message_count: int
    # "estimate" (ext_proc/tokens.py), "exact" (the model's tokenizer and chat template) or
    # "fallback" (a tokenizer is configured but could not count this request).
    input_tokens_source: str = "estimate"


class SchemaAdapter(Protocol):
    """One inference API: how to read a request and how to answer with an error."""

    name: str
    inject_field: str

    def features(self, body: dict[str, Any]) -> RequestFeatures:
        """Extract features from a decoded top-level object; raise ``BadRequest``."""
        ...

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        """An error response body in this API's own format."""
        ...


def optional_token_limit(body: dict[str, Any], field: str, *, minimum: int = 1) -> int | None:
    """Read an optional positive integer token limit, or raise ``BadRequest`` naming it."""
    if field not in body or body[field] is None:
        return None
    value = body[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(
            f"'{field}' must be an integer, got {type(value).__name__} {_short(value)}",
            param=field,
            code="invalid_type",
        )
    if value < minimum:
        raise BadRequest(
            f"'{field}' must be at least {minimum}, got {value}", param=field, code="invalid_value"
        )
    return min(value, MAX_SANE_TOKENS)


def text_of_content(content: Any, where: str) -> int:
    """Estimated tokens of a message ``content``: a string or a list of content parts.

    Text parts (``{"type": "text", "text": ...}``) are counted; other parts (images, tool
    results with nested content) count their own text where they have any.
    """
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, list):
        total = 0
        for i, part in enumerate(content):
            if isinstance(part, str):
                total += estimate_text_tokens(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += estimate_text_tokens(text)
                nested = part.get("content")
                if nested is not None and nested is not content:
                    total += text_of_content(nested, f"{where}[{i}].content")
            else:
                raise BadRequest(
                    f"'{where}[{i}]' must be a string or an object",
                    param=where,
                    code="invalid_type",
                )
        return total
    raise BadRequest(
        f"'{where}' must be a string or an array of content parts", param=where, code="invalid_type"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
