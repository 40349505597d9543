"""Media parts: which content parts, blocks and input items are images, audio or video, as
the servers read them, and what their data says about their size (``ext_proc.media``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ext_proc.media.headers import _audio_seconds, _data_url, audio_seconds, image_size

__all__ = ["MediaKind", "MediaPart", "part_of"]

MediaKind = Literal["image", "audio", "video"]

_PART_KINDS: dict[str, MediaKind] = {
    "image_url": "image",  # OpenAI chat; vLLM also accepts a plain string
    "input_image": "image",  # OpenAI Responses
    "image": "image",  # Anthropic
    "image_embeds": "image",  # vLLM
    "image_pil": "image",  # vLLM
    "input_audio": "audio",  # OpenAI chat and Responses
    "audio_url": "audio",  # vLLM
    "audio_embeds": "audio",  # vLLM (--enable-mm-embeds)
    "video_url": "video",  # vLLM
    "video_embeds": "video",  # vLLM (--enable-mm-embeds)
}
# vLLM reads a part without a type, or with a ``uuid``, by the first of these keys it has
# (vllm/renderers/chat_utils.py, _parse_chat_message_content_mm_part); ICE counts any part
# that carries one as media, whatever its type says (counting a text part with an image too
# errs towards refusing).
_MEDIA_KEYS: tuple[str, ...] = (
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "audio_url",
    "input_audio",
    "video_url",
)


@dataclass(frozen=True, slots=True)
class MediaPart:
    """One non-text part: its kind and what its data says about its size (``None``: unknown)."""

    kind: MediaKind
    width: int | None = None  # pixels
    height: int | None = None  # pixels
    seconds: float | None = None  # audio duration


def part_of(part: Mapping[str, Any]) -> MediaPart | None:
    """A content part / block / input item → ``MediaPart``; ``None`` when it is not media.

    Recognised (by ``type``): ``image_url`` (``{"url": …}`` or a plain string), ``input_image``
    (Responses), ``image`` (Anthropic, ``source`` base64 or url), ``image_embeds`` and
    ``image_pil`` (vLLM; unknown size), ``input_audio`` (``{"data": b64, "format": …}``),
    ``audio_url``, ``audio_embeds``, ``video_url`` and ``video_embeds``. A part of another
    type, of no type, or with a ``uuid`` is media when it carries one of those keys (vLLM
    reads such parts by their keys). Text, tool results and other types are not media.
    Never raises: odd values inside a recognised part give media of unknown size.
    """
    if not isinstance(part, Mapping):
        return None
    kind_name = part.get("type")
    kind = _PART_KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None or "uuid" in part:
        for key in _MEDIA_KEYS:
            if key in part:
                kind_name, kind = key, _PART_KINDS[key]
                break
    if kind is None or not isinstance(kind_name, str):
        return None
    try:
        if kind == "image":
            size = _image_part_size(kind_name, part)
            if size is not None:
                return MediaPart("image", width=size[0], height=size[1])
        elif kind == "audio":
            return MediaPart("audio", seconds=_audio_part_seconds(kind_name, part))
    except Exception:  # a recognised part with odd insides still counts, size unknown
        pass
    return MediaPart(kind)


def _url_of(value: Any) -> str | None:
    """``"…"`` or ``{"url": "…"}`` → the URL string."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        url = value.get("url")
        if isinstance(url, str):
            return url
    return None


def _image_part_size(kind_name: str, part: Mapping[str, Any]) -> tuple[int, int] | None:
    if kind_name in ("image_url", "input_image"):
        url = _url_of(part.get("image_url"))
        return image_size(url) if url is not None else None
    if kind_name == "image":
        source = part.get("source")
        if not isinstance(source, Mapping):
            return None
        if source.get("type") == "base64":
            data = source.get("data")
            return image_size(data, base64_data=True) if isinstance(data, str) else None
        url = source.get("url")
        return image_size(url) if isinstance(url, str) else None
    return None  # image_embeds, image_pil: no bytes to read


def _audio_part_seconds(kind_name: str, part: Mapping[str, Any]) -> float | None:
    if kind_name == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, Mapping):
            return None
        data, fmt = audio.get("data"), audio.get("format")
        if isinstance(data, str) and isinstance(fmt, str):
            return audio_seconds(data, fmt)
        return None
    url = _url_of(part.get("audio_url"))
    if url is None:
        return None
    parsed = _data_url(url)
    if parsed is None or not parsed[1]:
        return None
    media_type, _, start = parsed
    return _audio_seconds(url, start, media_type)
