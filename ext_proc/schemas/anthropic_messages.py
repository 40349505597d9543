"""Anthropic ``/v1/messages`` adapter.

Reads the top-level ``system`` (string or text blocks), ``messages`` with string or
content-block content, ``tools``, what the chat template renders besides (``documents``, the
strings of ``chat_template_kwargs``: vLLM converts the request to chat) and the required
``max_tokens``. Errors use Anthropic's format:
``{"type": "error", "error": {"type": ..., "message": ...}}``; ICE adds a machine-readable
``code`` (and ``param``) inside ``error``, which Anthropic clients ignore.
"""

from __future__ import annotations

import json
from typing import Any

from ext_proc.media import MediaCost
from ext_proc.schemas.base import (
    DEFAULT_MEDIA,
    BadRequest,
    RequestFeatures,
    Tally,
    check_keys,
    json_tokens,
    optional_token_limit,
)
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, REPLY_PRIMER_TOKENS
from ext_proc.schemas.openai import template_extra_tokens

__all__ = ["ANTHROPIC_MESSAGES", "anthropic_error_body"]

# Top-level keys the adapter and the exact counter read (a repeated one is a 400).
MESSAGES_KEYS = frozenset(
    (
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "tools",
        "thinking",
        "output_config",
        "chat_template_kwargs",
        "documents",
    )
)
MESSAGE_KEYS = frozenset(("role", "content"))

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, code: str, message: str, param: str | None) -> bytes:
    """Anthropic's error object as bytes."""
    err: dict[str, Any] = {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}
    err["code"] = code
    if param is not None:
        err["param"] = param
    return json.dumps({"type": "error", "error": err}, separators=(",", ":")).encode()


class _AnthropicMessages:
    name = "anthropic.messages"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, MESSAGES_KEYS)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: must be an array", param="messages", code="invalid_type")
        tally = Tally(media, tokens=REPLY_PRIMER_TOKENS)
        system = body.get("system")
        if system is not None:
            tally.tokens += PER_MESSAGE_TOKENS
            tally.content(system, "system")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise BadRequest(
                    f"messages.{i}: must be an object", param="messages", code="invalid_type"
                )
            check_keys(msg, MESSAGE_KEYS, f"messages[{i}]")
            tally.tokens += PER_MESSAGE_TOKENS
            tally.content(msg.get("content"), f"messages[{i}].content")
        if body.get("tools") is not None:
            tally.tokens += json_tokens(body["tools"])
        tally.tokens += template_extra_tokens(body)  # as vLLM's chat conversion renders them
        if body.get("max_tokens") is None:
            raise BadRequest("max_tokens: Field required", param="max_tokens", code="missing_field")
        model = body.get("model")
        return RequestFeatures(
            schema=self.name,
            model=model if isinstance(model, str) else None,
            input_tokens=tally.tokens,
            max_tokens=optional_token_limit(body, "max_tokens"),
            max_tokens_field="max_tokens",
            stream=body.get("stream") is True,
            message_count=len(messages),
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return anthropic_error_body(status, code, message, param)


ANTHROPIC_MESSAGES = _AnthropicMessages()
