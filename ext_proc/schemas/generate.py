"""Native generate endpoints: vLLM's ``/inference/v1/generate`` and SGLang's ``/generate``.

vLLM (``vllm.generate``, token in, tokens out): ``token_ids`` (the prompt, already tokenized
and with multimodal placeholders expanded), optional raw ``content_parts`` (media the server
resolves: counted at their media cost), ``sampling_params`` with ``max_tokens`` and ``n``.

SGLang (``sglang.generate``, chosen per route with ``schema: sglang_generate``, since
``/generate`` means different bodies on different servers): ``text`` (a string or a list of
strings) or ``input_ids`` (token ids or a list of token-id lists) or ``input_embeds`` (one
row per token); ``image_data`` / ``audio_data`` / ``video_data`` (one item or a list: each
item is a media part); ``sampling_params`` (an object, or a list of objects, one per prompt)
with ``max_new_tokens`` and ``n``. With a list, the largest limit (an absent one counts
SGLang's default, a null one the rest of the context) and ``n`` are judged, and a downgrade
rewrites every element. What an absent or null limit runs on each server:
``ext_proc.schemas.limits``.

The output limit lives inside ``sampling_params``: ``ext_proc.admit.outcome`` edits it there.
Errors use OpenAI's error object (both servers answer JSON errors of their own shape).
"""

from __future__ import annotations

from typing import Any

from ext_proc.media import MediaCost, MediaPart
from ext_proc.schemas.base import (
    DEFAULT_MEDIA,
    BadRequest,
    RequestFeatures,
    Tally,
    check_keys,
    optional_token_limit,
    samples_of,
    sent_null,
)
from ext_proc.schemas.limits import SGLANG_DEFAULT_MAX_NEW_TOKENS
from ext_proc.schemas.openai import openai_error_body, prompt_list_tokens

__all__ = ["SGLANG_DEFAULT_MAX_NEW_TOKENS", "SGLANG_GENERATE", "VLLM_GENERATE"]


VLLM_KEYS = frozenset(("model", "token_ids", "sampling_params", "content_parts", "stream"))
SGLANG_KEYS = frozenset(
    (
        "model",
        "text",
        "input_ids",
        "input_embeds",
        "sampling_params",
        "image_data",
        "audio_data",
        "video_data",
        "stream",
    )
)
SAMPLING_KEYS = frozenset(("max_tokens", "max_new_tokens", "n", "best_of"))


def _sampling(value: Any, where: str = "sampling_params") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be an object", param=where, code="invalid_type")
    check_keys(value, SAMPLING_KEYS, where)
    return value


def _limit(params: dict[str, Any], field: str, where: str) -> int | None:
    """The limit ``params`` sets (None: absent or null; ``ext_proc.schemas.limits`` says what
    each runs)."""
    try:
        return optional_token_limit(params, field)
    except BadRequest as e:
        raise BadRequest(
            e.message.replace(f"'{field}'", f"'{where}.{field}'"), param=e.param, code=e.code
        ) from None


class _VllmGenerate:
    name = "vllm.generate"
    inject_field = "max_tokens"  # inside sampling_params

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, VLLM_KEYS)
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not ids:
            raise BadRequest(
                "'token_ids' must be a non-empty array of token ids",
                param="token_ids",
                code="invalid_type",
            )
        tally = Tally(media, tokens=len(ids))
        if body.get("content_parts") is not None:
            tally.content(body["content_parts"], "content_parts")
        params = _sampling(body.get("sampling_params"))
        field = "max_tokens" if params.get("max_tokens") is not None else None
        model = body.get("model")
        return RequestFeatures(
            schema=self.name,
            model=model if isinstance(model, str) else None,
            input_tokens=tally.tokens,
            max_tokens=_limit(params, "max_tokens", "sampling_params"),
            max_tokens_field=field,
            limit_null=field is None and sent_null(params, "max_tokens"),
            stream=body.get("stream") is True,
            message_count=1,
            samples=samples_of(params, "n", "best_of"),
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
            # SamplingParams with prompt_logprobs skips reading the prefix cache (vLLM 0.32)
            reads_prefix_cache=params.get("prompt_logprobs") is None,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


def _media_items(value: Any, kind: str, tally: Tally) -> None:
    """SGLang's ``image_data`` etc.: one item or (nested) lists of items, each a part."""
    if value is None:
        return
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, list):
            _media_items(item, kind, tally)
            continue
        part = MediaPart(
            kind="image" if kind == "image" else "audio" if kind == "audio" else "video"
        )
        if kind == "image" and isinstance(item, str):
            from ext_proc.media import image_size

            size = image_size(item)
            if size is not None:
                part = MediaPart(kind="image", width=size[0], height=size[1])
        cost = tally.media.tokens(part)
        tally.media_parts += 1
        tally.media_tokens += cost


class _SglangGenerate:
    name = "sglang.generate"
    inject_field = "max_new_tokens"  # inside sampling_params

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, SGLANG_KEYS)
        given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
        if len(given) > 1:
            raise BadRequest(
                f"give one of 'text', 'input_ids' or 'input_embeds', not {' and '.join(given)}",
                param=given[1],
                code="ambiguous_input",
            )
        if body.get("text") is not None:
            prompts = prompt_list_tokens(body["text"], "text")
        elif body.get("input_ids") is not None:
            prompts = prompt_list_tokens(body["input_ids"], "input_ids")
        elif isinstance(body.get("input_embeds"), list) and body["input_embeds"]:
            embeds = body["input_embeds"]
            batch = all(isinstance(e, list) and e and isinstance(e[0], list) for e in embeds)
            prompts = [len(e) for e in embeds] if batch else [len(embeds)]
        else:
            raise BadRequest(
                "give 'text', 'input_ids' or 'input_embeds'", param="text", code="missing_field"
            )
        tally = Tally(media)
        for kind in ("image", "audio", "video"):
            _media_items(body.get(f"{kind}_data"), kind, tally)
        raw = body.get("sampling_params")
        if raw is None:
            params_list: list[dict[str, Any]] = [{}]
        elif isinstance(raw, list) and raw:
            params_list = [_sampling(p, f"sampling_params[{i}]") for i, p in enumerate(raw)]
        else:
            params_list = [_sampling(raw)]
        # each element runs its own limit: a number, SGLang's default when absent, or the
        # rest of the context when null; the largest is judged
        limits = [_limit(p, "max_new_tokens", "sampling_params") for p in params_list]
        nulls = any(sent_null(p, "max_new_tokens") for p in params_list)
        absent = any("max_new_tokens" not in p for p in params_list)
        values = [v for v in limits if v is not None]
        limit: int | None = None  # the rest of the context, or SGLang's default for all
        if values and not nulls:
            limit = max([*values, SGLANG_DEFAULT_MAX_NEW_TOKENS] if absent else values)
        set_fields = any(p.get("max_new_tokens") is not None for p in params_list)
        samples = max(samples_of(p, "n") for p in params_list)
        # media are shared by the batch's prompts only in SGLang's own pairing; counting them
        # on every prompt errs towards refusing
        prompts = [p + tally.media_tokens for p in prompts]
        model = body.get("model")
        return RequestFeatures(
            schema=self.name,
            model=model if isinstance(model, str) else None,
            input_tokens=max(prompts),
            max_tokens=limit,
            max_tokens_field="max_new_tokens" if set_fields else None,
            limit_null=nulls,
            stream=body.get("stream") is True,
            message_count=len(prompts),
            prompt_tokens=tuple(prompts) if len(prompts) > 1 else (),
            samples=samples,
            media_parts=tally.media_parts,
            media_tokens=tally.media_tokens,
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


VLLM_GENERATE = _VllmGenerate()
SGLANG_GENERATE = _SglangGenerate()
