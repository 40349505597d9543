"""OpenAI ``/v1/responses`` (the Responses API) adapter.

Reads ``input`` (a string, or a list of items: messages with string or part content,
``function_call`` and ``function_call_output`` items, ``reasoning`` items; an item of another
type counts the tokens of its JSON text), ``instructions``, ``tools`` (their JSON) and the
output limit ``max_output_tokens`` (ICE injects and rewrites that field). Media parts
(``input_image``, ``input_audio``) count their media cost. The Responses API has no ``n``.

Stored context: ``previous_response_id``, ``conversation``, a stored ``prompt`` template, or an
``item_reference`` input item put part of the prompt at the backend, where ICE cannot count
it. Such a request sets ``stored_context``; the evaluator then judges each of its sequences to
fill the whole context window (``max_model_len``) in the KV checks, or refuses it with a 400
when the profile says ``stored_context: reject``.
Errors use OpenAI's error object.
"""

from __future__ import annotations

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
    sent_null,
    string_type,
)
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, REPLY_PRIMER_TOKENS
from ext_proc.schemas.openai import openai_error_body

__all__ = ["OPENAI_RESPONSES", "STORED_CONTEXT_FIELDS"]

RESPONSES_KEYS = frozenset(
    (
        "model",
        "input",
        "instructions",
        "tools",
        "max_output_tokens",
        "stream",
        "previous_response_id",
        "conversation",
        "prompt",
    )
)
ITEM_KEYS = frozenset(("type", "role", "content", "name", "arguments", "output", "summary"))
# Fields that put part of the prompt at the backend (non-null → stored context).
STORED_CONTEXT_FIELDS = ("previous_response_id", "conversation", "prompt")


def _item(item: Any, where: str, tally: Tally) -> bool:
    """Add one input item's tokens; return whether it refers to stored context."""
    if isinstance(item, str):
        tally.text(item)
        return False
    if not isinstance(item, dict):
        raise BadRequest(f"'{where}' must be an object", param="input", code="invalid_type")
    check_keys(item, ITEM_KEYS, where)
    kind = string_type(item, where)
    tally.tokens += PER_MESSAGE_TOKENS
    if kind == "item_reference":
        return True
    if kind in (None, "message"):
        if "content" not in item:
            raise BadRequest(f"'{where}.content' is required", param="input", code="missing_field")
        tally.content(item.get("content"), f"{where}.content")
    elif kind == "function_call":
        tally.text(item.get("name"))
        tally.text(item.get("arguments"))
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            tally.content(output, f"{where}.output")
        else:
            tally.text(output)
    elif kind == "reasoning":
        for key in ("summary", "content"):
            parts = item.get(key)
            if isinstance(parts, list):
                tally.content(parts, f"{where}.{key}")
    else:
        tally.tokens += json_tokens(item)
    return False


class _OpenAIResponses:
    name = "openai.responses"
    inject_field = "max_output_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, RESPONSES_KEYS)
        tally = Tally(media, tokens=REPLY_PRIMER_TOKENS)
        stored = any(body.get(name) is not None for name in STORED_CONTEXT_FIELDS)
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise BadRequest(
                    "'instructions' must be a string", param="instructions", code="invalid_type"
                )
            tally.tokens += PER_MESSAGE_TOKENS
            tally.text(instructions)
        data = body.get("input")
        count = 0
        if isinstance(data, str):
            tally.tokens += PER_MESSAGE_TOKENS
            tally.text(data)
            count = 1
        elif isinstance(data, list):
            for i, item in enumerate(data):
                stored = _item(item, f"input[{i}]", tally) or stored
            count = len(data)
        elif data is not None or not stored:
            raise BadRequest(
                "'input' must be a string or an array of input items",
                param="input",
                code="invalid_type",
            )
        if body.get("tools") is not None:
            tally.tokens += json_tokens(body["tools"])
        limit = optional_token_limit(body, "max_output_tokens")
        model = body.get("model")
        return RequestFeatures(
            schema=self.name,
            model=model if isinstance(model, str) else None,
            input_tokens=tally.tokens,
            max_tokens=limit,
            max_tokens_field="max_output_tokens" if limit is not None else None,
            limit_null=limit is None and sent_null(body, "max_output_tokens"),
            stream=body.get("stream") is True,
            message_count=count,
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
            stored_context=stored,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


OPENAI_RESPONSES = _OpenAIResponses()
