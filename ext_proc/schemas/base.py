"""What every schema adapter produces and needs.

``RequestFeatures`` are the facts about one request that the evaluator judges; ``BadRequest``
is raised by an adapter when the body breaks its API's contract (or is ambiguous: a key ICE
reads given twice), carrying the offending parameter so the error can name it. ``Tally``
adds up one prompt's estimated tokens as an adapter walks it, media parts included.

Invariants:
- ``input_tokens`` is the longest prompt's tokens (what the context checks judge), media
  tokens included; ``prompt_tokens`` holds every prompt's when a request carries more than
  one (a completions batch, batch chat, embeddings inputs), else it is empty.
- ``samples`` is the number of sequences each prompt starts: ``max(n, best_of)``.
- ``reads_prefix_cache`` is False when the backend will not read its prefix cache for the
  request (``ext_proc.schemas.openai.reads_prefix_cache``): its samples share no block.
- A key an adapter reads that the body gives twice (``rawjson.duplicate_keys``) is a
  ``BadRequest`` naming it: backends disagree on which copy wins, so ICE cannot know what it
  would judge. Keys an adapter does not read may repeat freely.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ext_proc.media import MediaCost, media_cost, part_of
from ext_proc.media.spec import MediaSpec
from ext_proc.schemas.estimate import estimate_text_tokens
from ext_proc.schemas.rawjson import duplicate_keys

__all__ = [
    "DEFAULT_MEDIA",
    "MAX_SANE_TOKENS",
    "BadRequest",
    "RequestFeatures",
    "SchemaAdapter",
    "Tally",
    "check_keys",
    "json_tokens",
    "optional_token_limit",
    "samples_of",
    "sent_null",
    "string_type",
    "text_of_content",
]

# Larger token limits are clamped for arithmetic: no model has a context near 2^53.
MAX_SANE_TOKENS = 2**53

DEFAULT_MEDIA = media_cost(MediaSpec())


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
    # "estimate" (ext_proc/schemas/estimate.py), "exact" (the model's tokenizer and chat template)
    # or "fallback" (a tokenizer is configured but could not count this request).
    input_tokens_source: str = "estimate"
    # tokens of each prompt when the request carries several (each its own sequence group)
    prompt_tokens: tuple[int, ...] = ()
    samples: int = 1  # sequences per prompt: max(n, best_of)
    # False: vLLM does not read the prefix cache for it (prompt logprobs asked, or echo with
    # logprobs: ``SamplingParams.skip_reading_prefix_cache``), so no sample shares a block
    reads_prefix_cache: bool = True
    media_parts: int = 0  # image, audio and video parts
    media_tokens: int = 0  # their tokens (in input_tokens and prompt_tokens)
    generates: bool = True  # False: embeddings (no output tokens)
    stored_context: bool = False  # part of the prompt is stored at the backend
    inputs: int = 0  # embeddings: the inputs of the request
    # exact counts: "pieces" (turns counted apart, cached) or "whole" (ext_proc.tokencount)
    count_mode: str = ""
    # output tokens per sequence the request must generate: vLLM's min_tokens, or its whole
    # limit with ignore_eos (the forecast's floor)
    min_output: int = 0
    # the limit field was sent as null (None: absent). Backends run the two differently on
    # some APIs (ext_proc/schemas/limits.py); with ``max_tokens`` set it is False
    limit_null: bool = False

    @property
    def prompts(self) -> tuple[int, ...]:
        """Tokens of every prompt (one entry per prompt)."""
        return self.prompt_tokens or (self.input_tokens,)

    @property
    def sequences(self) -> int:
        """The sequences the request starts: prompts × samples."""
        return len(self.prompts) * self.samples

    def prompt_groups(self) -> tuple[tuple[int, int], ...]:
        """(tokens, how many prompts have them): the KV arithmetic's loop stays short for a
        batch of equal prompts."""
        if not self.prompt_tokens:
            return ((self.input_tokens, 1),)
        return tuple(sorted(Counter(self.prompt_tokens).items()))


class SchemaAdapter(Protocol):
    """One inference API: how to read a request and how to answer with an error."""

    name: str
    inject_field: str

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        """Extract features from a decoded top-level object; raise ``BadRequest``."""
        ...

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        """An error response body in this API's own format."""
        ...


def check_keys(obj: Mapping[str, Any], read: Collection[str], where: str = "") -> None:
    """Raise ``BadRequest`` when ``obj`` repeats a key of ``read`` (see the module invariant)."""
    dups = duplicate_keys(obj)
    if not dups:
        return
    for key in sorted(dups):
        if key in read:
            name = f"{where}.{key}" if where else key
            raise BadRequest(
                f"'{name}' is given more than once; send each parameter once (servers "
                f"disagree on which copy wins)",
                param=name,
                code="duplicate_key",
            )


def optional_token_limit(body: Mapping[str, Any], field: str, *, minimum: int = 1) -> int | None:
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


def sent_null(body: Mapping[str, Any], *fields: str) -> bool:
    """Whether the body names one of ``fields`` with ``null`` (and none of them with a value)."""
    named = [f for f in fields if f in body]
    return bool(named) and all(body[f] is None for f in named)


def samples_of(body: Mapping[str, Any], *fields: str) -> int:
    """Sequences per prompt: the largest of the fields (``n``, ``best_of``) set, at least 1.

    ``best_of`` is counted although vLLM 0.32 ignores it: older vLLM releases and other
    servers generate ``best_of`` sequences and return the best ``n``."""
    samples = 1
    for name in fields:
        value = optional_token_limit(body, name)
        if value is not None:
            samples = max(samples, value)
    return samples


def json_tokens(value: Any) -> int:
    """Estimated tokens of a JSON value as text (tool schemas, arguments, unknown items)."""
    if isinstance(value, str):
        return estimate_text_tokens(value)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = str(value)
    return estimate_text_tokens(text)


# Keys of a content part / block that ICE reads (duplicates of these are refused).
PART_KEYS = frozenset(
    (
        "type",
        "text",
        "content",
        "image_url",
        "input_audio",
        "audio_url",
        "video_url",
        "source",
        "input",
        "thinking",
        "name",
        "refusal",
        "data",
        "uuid",
        "image_pil",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "prompt_embeds",
    )
)


@dataclass(slots=True)
class Tally:
    """One prompt's estimated tokens, media parts and media tokens, as an adapter walks it."""

    media: MediaCost
    tokens: int = 0
    media_parts: int = 0
    media_tokens: int = 0
    _parts: list[Any] = field(default_factory=list)

    def text(self, value: Any) -> None:
        if isinstance(value, str):
            self.tokens += estimate_text_tokens(value)

    def content(self, content: Any, where: str) -> None:
        """A message ``content``: a string or a list of content parts / blocks.

        Text parts count their text; media parts (images, audio, video) their media cost;
        tool-use blocks their input's JSON; tool results and nested blocks their own
        content."""
        if content is None:
            return
        if isinstance(content, str):
            self.tokens += estimate_text_tokens(content)
            return
        if not isinstance(content, list):
            raise BadRequest(
                f"'{where}' must be a string or an array of content parts",
                param=where,
                code="invalid_type",
            )
        for i, part in enumerate(content):
            if isinstance(part, str):
                self.tokens += estimate_text_tokens(part)
            elif isinstance(part, dict):
                self.part(part, f"{where}[{i}]")
            else:
                raise BadRequest(
                    f"'{where}[{i}]' must be a string or an object",
                    param=where,
                    code="invalid_type",
                )

    def part(self, part: dict[str, Any], where: str) -> None:
        """One content part or block: text types count their text, media their media cost,
        tool-use blocks their input's JSON, tool results and other containers their nested
        content; a part of any other type counts the tokens of its whole JSON text, so an
        unknown part never costs nothing."""
        check_keys(part, PART_KEYS, where)
        kind = string_type(part, where)
        if kind == "prompt_embeds" or "prompt_embeds" in part:
            raise BadRequest(
                f"'{where}': prompt embeddings cannot be judged by this gateway (their token "
                f"count is inside the tensor); send text or token ids",
                param=where,
                code="unsupported_field",
            )
        media = part_of(part)
        if media is not None:
            cost = self.media.tokens(media)
            self.media_parts += 1
            self.media_tokens += cost
            self.tokens += cost
            return
        text = part.get(_TEXT_FIELD.get(kind, "text") if kind is not None else "text")
        if isinstance(text, str):
            self.tokens += estimate_text_tokens(text)
        if kind == "tool_use":
            self.tokens += json_tokens(part.get("input")) + json_tokens(part.get("name") or "")
        nested = part.get("content")
        if nested is not None:
            self.content(nested, f"{where}.content")
        if kind not in _KNOWN_PARTS:
            self.tokens += json_tokens(part)


# The field holding a text-like part's text, by part type (default "text").
_TEXT_FIELD = {"refusal": "refusal", "thinking": "thinking", "redacted_thinking": "data"}
# Part types whose cost is their text / input / nested content (others: their whole JSON).
_KNOWN_PARTS = frozenset(
    (
        None,
        "text",
        "input_text",
        "output_text",
        "refusal",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
    )
)


def string_type(obj: Mapping[str, Any], where: str) -> str | None:
    """``obj``'s ``type`` (None when absent or null); any other non-string is a
    ``BadRequest``: no API has a part or item type that is not a string."""
    kind = obj.get("type")
    if kind is None or isinstance(kind, str):
        return kind
    raise BadRequest(
        f"'{where}.type' must be a string, got {json_type(kind)}",
        param=f"{where}.type",
        code="invalid_type",
    )


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (for error messages)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    for kind, name in ((str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def text_of_content(content: Any, where: str, media: MediaCost = DEFAULT_MEDIA) -> int:
    """Estimated tokens of a message ``content`` (see ``Tally.content``)."""
    tally = Tally(media)
    tally.content(content, where)
    return tally.tokens


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
