"""OpenAI ``/v1/chat/completions``, ``/v1/completions`` and vLLM's batch chat adapters.

Chat: ``messages`` (string or content-part array content, media parts at their cost; an
assistant's ``reasoning`` / ``reasoning_content``), ``tools`` (their JSON), what else the
template renders (``documents``, the strings of ``chat_template_kwargs``), output limit
``max_completion_tokens`` when it is set and not null, else ``max_tokens`` (the precedence
of vLLM, SGLang and OpenAI); ``n`` and ``best_of`` samples. Completions: ``prompt`` as a
string, a list of strings, token ids or a list of token-id lists (each list element is its
own prompt, as in vLLM), limit ``max_tokens``, samples ``max(n, best_of)``. Batch chat
(vLLM's ``/v1/chat/completions/batch``): ``messages`` is a list of conversations, each its
own prompt, with chat's limits.
Errors use OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    sent_null,
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
    "reads_prefix_cache",
    "reasoning_tokens",
    "template_extra_tokens",
    "tool_call_tokens",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # OpenAI's own, for a missing or bad key
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
        "documents",
        "prompt_logprobs",
        "echo",
        "top_logprobs",
        "min_tokens",
        "ignore_eos",
    )
)
MESSAGE_KEYS = frozenset(
    ("role", "content", "tool_calls", "name", "tool_call_id", "reasoning", "reasoning_content")
)
# Template kwargs the exact counter (as vLLM) never hands the template as they are.
_NOT_RENDERED = frozenset(("messages", "tools", "documents", "add_generation_prompt"))
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
        "prompt_logprobs",
        "echo",
        "logprobs",
        "min_tokens",
        "ignore_eos",
    )
)


def min_output_of(body: Mapping[str, Any], limit: int | None) -> int:
    """Output tokens per sequence vLLM must generate: ``min_tokens`` (its sampling
    extension; anything but a positive integer counts as 0: vLLM answers those itself), or,
    with ``ignore_eos: true``, the whole limit when one is set."""
    got = body.get("min_tokens")
    floor = got if isinstance(got, int) and not isinstance(got, bool) and got > 0 else 0
    if body.get("ignore_eos") is True and limit is not None:
        floor = max(floor, limit)
    return floor if limit is None else min(floor, limit)


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


def reasoning_tokens(msg: dict[str, Any]) -> int:
    """An assistant message's reasoning, which reasoning models' templates (Qwen3-style) put
    back into the prompt: vLLM copies ``reasoning`` into the template's ``reasoning`` and
    ``reasoning_content``; servers that hand the message on as sent render
    ``reasoning_content``. The larger of the two counts (any JSON value: its text)."""
    if msg.get("role") != "assistant":
        return 0
    given = (msg[k] for k in ("reasoning", "reasoning_content") if msg.get(k) is not None)
    return max((json_tokens(v) for v in given), default=0)


def documents_tokens(documents: Any) -> int:
    """RAG ``documents`` as a template renders them: each document's JSON text (its keys
    and values: titles and texts) and ``PER_MESSAGE_TOKENS`` of framing."""
    if isinstance(documents, list):
        return sum(PER_MESSAGE_TOKENS + json_tokens(d) for d in documents)
    return json_tokens(documents)


def strings_tokens(value: Any) -> int:
    """Tokens of every string inside a JSON value (keys aside): the text a template kwarg
    may add; numbers and booleans only switch a template's branches."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += estimate_text_tokens(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def template_extra_tokens(body: dict[str, Any]) -> int:
    """Text a chat template renders besides the messages and ``tools``, as the exact counter
    hands it over: ``documents`` (top level; else ``chat_template_kwargs.documents``) and the
    strings of each other ``chat_template_kwargs`` value (with a message's framing)."""
    documents = body.get("documents")
    kwargs = body.get("chat_template_kwargs")
    if not isinstance(kwargs, dict):
        kwargs = {}
    if documents is None:
        documents = kwargs.get("documents")
    extra = documents_tokens(documents) if documents is not None else 0
    for key, value in kwargs.items():
        text = strings_tokens(value) if key not in _NOT_RENDERED else 0
        extra += text + PER_MESSAGE_TOKENS if text else 0  # framed as a message would be
    return extra


def reads_prefix_cache(body: dict[str, Any], logprobs: str, absent: int | None) -> bool:
    """Whether vLLM reads its prefix cache for the request: not when prompt logprobs are
    asked, ``prompt_logprobs`` or ``echo`` with ``logprobs`` (``logprobs`` is chat's
    ``top_logprobs``, default 0, or completions' ``logprobs``, default None: ``absent``).
    vLLM 0.32: ``to_sampling_params`` (``entrypoints/openai/{chat_completion,completion}/
    protocol.py``) sets ``prompt_logprobs`` from them, ``SamplingParams.__post_init__``
    (``sampling_params.py``) then ``skip_reading_prefix_cache``, and the scheduler looks up no
    cached block (``v1/core/kv_cache_manager.py``, ``prefix_cache_lookup_enabled``): each
    sample prefills its whole prompt."""
    if body.get("prompt_logprobs") is not None:
        return False
    return not (body.get("echo") is True and body.get(logprobs, absent) is not None)


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
        tally.tokens += reasoning_tokens(msg)
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
        tally.tokens += template_extra_tokens(body)
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
            reads_prefix_cache=reads_prefix_cache(body, "top_logprobs", 0),
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
            min_output=min_output_of(body, limit),
            limit_null=limit is None and sent_null(body, "max_completion_tokens", "max_tokens"),
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
        tools += template_extra_tokens(body)  # rendered into every conversation
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
            reads_prefix_cache=reads_prefix_cache(body, "top_logprobs", 0),
            media_parts=parts,
            media_tokens=media_tokens,
            min_output=min_output_of(body, limit),
            limit_null=limit is None and sent_null(body, "max_completion_tokens", "max_tokens"),
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
        limit = optional_token_limit(body, "max_tokens")
        return RequestFeatures(
            schema=self.name,
            model=_model(body),
            input_tokens=max(prompts),
            max_tokens=limit,
            max_tokens_field="max_tokens" if body.get("max_tokens") is not None else None,
            stream=_stream(body),
            message_count=len(prompts),
            prompt_tokens=tuple(prompts) if len(prompts) > 1 else (),
            samples=samples_of(body, "n", "best_of"),
            reads_prefix_cache=reads_prefix_cache(body, "logprobs", None),
            min_output=min_output_of(body, 16 if limit is None else limit),
            limit_null=limit is None and sent_null(body, "max_tokens"),
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


OPENAI_CHAT = _OpenAIChat()
OPENAI_CHAT_BATCH = _OpenAIChatBatch()
OPENAI_COMPLETIONS = _OpenAICompletions()
