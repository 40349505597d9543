"""OpenAI ``/v1/chat/completions`` and ``/v1/completions`` adapters.

Chat: ``messages`` (string or content-part array content), output limit in
``max_completion_tokens`` (preferred by OpenAI) or the older ``max_tokens``; when both are
present the smaller binds. Completions: ``prompt`` as a string or a list of strings (token-id
arrays count one token per id), limit in ``max_tokens``.
Errors use OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from ext_proc.schemas.base import BadRequest, RequestFeatures, optional_token_limit, text_of_content
from ext_proc.tokens import PER_MESSAGE_TOKENS, REPLY_PRIMER_TOKENS, estimate_text_tokens

__all__ = ["OPENAI_CHAT", "OPENAI_COMPLETIONS", "openai_error_body", "tool_call_tokens"]

_ERROR_TYPES = {400: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def openai_error_body(status: int, code: str, message: str, param: str | None) -> bytes:
    """OpenAI's error object as bytes."""
    err = {
        "message": message,
        "type": _ERROR_TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
    }
    return json.dumps({"error": err}, separators=(",", ":")).encode()


def tool_call_tokens(calls: list[Any]) -> int:
    """Tokens of OpenAI ``tool_calls``: each call's function name and JSON arguments string,
    plus ``PER_MESSAGE_TOKENS`` of framing per call."""
    total = 0
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            for key in ("name", "arguments"):
                text = fn.get(key)
                if isinstance(text, str):
                    total += estimate_text_tokens(text)
        total += PER_MESSAGE_TOKENS
    return total


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


def _stream(body: dict[str, Any]) -> bool:
    return body.get("stream") is True


class _OpenAIChat:
    name = "openai.chat"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any]) -> RequestFeatures:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("'messages' must be an array", param="messages", code="invalid_type")
        tokens = REPLY_PRIMER_TOKENS
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise BadRequest(
                    f"'messages[{i}]' must be an object", param="messages", code="invalid_type"
                )
            tokens += PER_MESSAGE_TOKENS + text_of_content(
                msg.get("content"), f"messages[{i}].content"
            )
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                tokens += tool_call_tokens(calls)
        mct = optional_token_limit(body, "max_completion_tokens")
        mt = optional_token_limit(body, "max_tokens")
        if mct is not None and (mt is None or mct <= mt):
            limit, field = mct, "max_completion_tokens"
        elif mt is not None:
            limit, field = mt, "max_tokens"
        else:
            limit, field = None, None
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=tokens,
            max_tokens=limit,
            max_tokens_field=field,
            stream=_stream(body),
            message_count=len(messages),
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


class _OpenAICompletions:
    name = "openai.completions"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any]) -> RequestFeatures:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            tokens, count = estimate_text_tokens(prompt), 1
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            # A batch: each prompt is its own sequence; the longest one bounds the context.
            tokens, count = max((estimate_text_tokens(p) for p in prompt), default=0), len(prompt)
        elif isinstance(prompt, list) and all(
            isinstance(p, int) and not isinstance(p, bool) for p in prompt
        ):
            tokens, count = len(prompt), 1
        elif isinstance(prompt, list) and all(isinstance(p, list) for p in prompt):
            tokens, count = max((len(p) for p in prompt), default=0), len(prompt)
        else:
            raise BadRequest(
                "'prompt' must be a string, an array of strings or of token ids",
                param="prompt",
                code="invalid_type",
            )
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=tokens,
            max_tokens=optional_token_limit(body, "max_tokens"),
            max_tokens_field="max_tokens" if body.get("max_tokens") is not None else None,
            stream=_stream(body),
            message_count=count,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


OPENAI_CHAT = _OpenAIChat()
OPENAI_COMPLETIONS = _OpenAICompletions()
