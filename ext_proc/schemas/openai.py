"""OpenAI ``/v1/chat/completions``, ``/v1/completions`` and vLLM's batch chat adapters.

Chat: ``messages`` (string or content-part array content, media parts at their cost),
``tools`` (their JSON), output limit ``max_completion_tokens`` when it is set and not null,
else ``max_tokens`` (the precedence of vLLM, SGLang and OpenAI); ``n`` and ``best_of``
samples. Completions: ``prompt`` as a string, a list of strings, token ids or a list of
token-id lists (each list element is its own prompt, as in vLLM), limit ``max_tokens``,
samples ``max(n, best_of)``. Batch chat (vLLM's ``/v1/chat/completions/batch``): ``messages``
is a list of conversations, each its own prompt, with chat's limits.
Errors use OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``.
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
    samples_of,
)
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, REPLY_PRIMER_TOKENS, estimate_text_tokens

__all__ = [
    "CHAT_KEYS",
    "OPENAI_CHAT",
    "OPENAI_CHAT_BATCH",
    "OPENAI_COMPLETIONS",
    "chat_limit",
    "chat_prompt",
    "openai_error_body",
    "tool_call_tokens",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}

# Top-level keys the chat adapter, the exact counter and truncation read.
CHAT_KEYS = frozenset(
    (
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "best_of",
        "stream",
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template_kwargs",
        "reasoning_effort",
    )
)
MESSAGE_KEYS = frozenset(("role", "content", "tool_calls", "name", "tool_call_id"))
COMPLETION_KEYS = frozenset(
    (
        "model",
        "prompt",
        "prompt_embeds",
        "max_tokens",
        "n",
        "best_of",
        "stream",
        "add_special_tokens",
    )
)


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


def chat_prompt(messages: Any, where: str, tally: Tally) -> int:
    """Add one conversation's tokens to ``tally`` (reply primer, framing, contents, tool
    calls); return its message count."""
    if not isinstance(messages, list):
        raise BadRequest(f"'{where}' must be an array", param=where, code="invalid_type")
    tally.tokens += REPLY_PRIMER_TOKENS
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"'{where}[{i}]' must be an object", param=where, code="invalid_type")
        check_keys(msg, MESSAGE_KEYS, f"{where}[{i}]")
        tally.tokens += PER_MESSAGE_TOKENS
        tally.content(msg.get("content"), f"{where}[{i}].content")
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            tally.tokens += tool_call_tokens(calls)
    return len(messages)


def chat_limit(body: dict[str, Any]) -> tuple[int | None, str | None]:
    """The output limit the backend uses: ``max_completion_tokens`` when set and not null,
    else ``max_tokens`` (both are validated)."""
    mct = optional_token_limit(body, "max_completion_tokens")
    mt = optional_token_limit(body, "max_tokens")
    if mct is not None:
        return mct, "max_completion_tokens"
    if mt is not None:
        return mt, "max_tokens"
    return None, None


class _OpenAIChat:
    name = "openai.chat"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, CHAT_KEYS)
        tally = Tally(media)
        count = chat_prompt(body.get("messages"), "messages", tally)
        if body.get("tools") is not None:
            tally.tokens += json_tokens(body["tools"])
        limit, field = chat_limit(body)
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=tally.tokens,
            max_tokens=limit,
            max_tokens_field=field,
            stream=_stream(body),
            message_count=count,
            samples=samples_of(body, "n", "best_of"),
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


class _OpenAIChatBatch:
    """vLLM's ``/v1/chat/completions/batch``: ``messages`` is a list of conversations."""

    name = "openai.chat_batch"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, CHAT_KEYS)
        conversations = body.get("messages")
        if not isinstance(conversations, list) or not conversations:
            raise BadRequest(
                "'messages' must be a non-empty array of conversations (arrays of messages)",
                param="messages",
                code="invalid_type",
            )
        tools = json_tokens(body["tools"]) if body.get("tools") is not None else 0
        prompts: list[int] = []
        parts = media_tokens = messages = 0
        for i, conversation in enumerate(conversations):
            tally = Tally(media)
            messages += chat_prompt(conversation, f"messages[{i}]", tally)
            prompts.append(tally.tokens + tools)
            parts += tally.media_parts
            media_tokens += tally.media_tokens
        limit, field = chat_limit(body)
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=max(prompts),
            max_tokens=limit,
            max_tokens_field=field,
            stream=_stream(body),
            message_count=messages,
            prompt_tokens=tuple(prompts) if len(prompts) > 1 else (),
            samples=samples_of(body, "n", "best_of"),
            media_parts=parts,
            media_tokens=media_tokens,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


def prompt_list_tokens(prompt: Any, param: str) -> list[int]:
    """Tokens of each prompt of a completions-style ``prompt`` / embeddings ``input``: a
    string, a list of strings, token ids, or a list of token-id lists."""
    if isinstance(prompt, str):
        return [estimate_text_tokens(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [estimate_text_tokens(p) for p in prompt]
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [len(prompt)]
        if all(isinstance(p, list) for p in prompt):
            return [len(p) for p in prompt]
    if isinstance(prompt, list) and not prompt:
        raise BadRequest(f"'{param}' must not be empty", param=param, code="invalid_value")
    raise BadRequest(
        f"'{param}' must be a string, an array of strings or of token ids",
        param=param,
        code="invalid_type",
    )


class _OpenAICompletions:
    name = "openai.completions"
    inject_field = "max_tokens"

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, COMPLETION_KEYS)
        if body.get("prompt_embeds") is not None:
            # vLLM (--enable-prompt-embeds) serves each tensor as one more prompt, of a length
            # only the tensor knows
            raise BadRequest(
                "'prompt_embeds' cannot be judged by this gateway (their token count is inside "
                "the tensors); send text or token ids in 'prompt'",
                param="prompt_embeds",
                code="unsupported_field",
            )
        prompts = prompt_list_tokens(body.get("prompt"), "prompt")
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=max(prompts),
            max_tokens=optional_token_limit(body, "max_tokens"),
            max_tokens_field="max_tokens" if body.get("max_tokens") is not None else None,
            stream=_stream(body),
            message_count=len(prompts),
            prompt_tokens=tuple(prompts) if len(prompts) > 1 else (),
            samples=samples_of(body, "n", "best_of"),
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


OPENAI_CHAT = _OpenAIChat()
OPENAI_CHAT_BATCH = _OpenAIChatBatch()
OPENAI_COMPLETIONS = _OpenAICompletions()
