"""What a non-text part of a prompt (image, audio, video) costs in prompt (KV) tokens.

Job: turn one content part, block or input item of a request into a ``MediaPart`` (its kind
and, when the data says, its pixel size or duration), and price a ``MediaPart`` in tokens
for one profile's ``MediaSpec``. Pure: no network, no pixel decoding; the only files read are
the model folder's ``preprocessor_config.json`` / ``config.json``, once per spec.

Invariants:
- ``MediaCost.tokens`` is always ≥ 1: media is never free.
- ``part_of``, ``image_size`` and ``audio_seconds`` never raise. Input they cannot read gives
  "unknown size" (``None``), and an unknown size is priced at its worst case (or the profile's
  default), never at less than a known size of the same model could cost.
- Image sizes come from header bytes only: the first 4 KiB of base64 text is decoded, then
  the first 64 KiB, and the whole payload only when the header lies further in (a JPEG with
  a long EXIF/ICC segment before its SOF). PNG, JPEG and GIF headers are read by Pillow's
  format plugins, imported on the first image, not before; WebP's first chunk is read here
  (Pillow's WebP reader builds a decoder and allocates the canvas on open).
- ``exact`` names the rule that priced images: "qwen2_vl", "llava", or "" (the defaults).

Cost rules (tokens; sizes in pixels; durations in seconds):

Defaults — no ``model_dir``, or a model whose processor is not modelled here:
  image  → ``spec.tokens_per_image`` (576)
  audio  → ``ceil(seconds × spec.tokens_per_audio_second)`` (25.0 tokens/s) when the duration
           is known, else ``spec.tokens_per_audio`` (750)
  video  → ``spec.tokens_per_video`` (4096)
  Audio and video always use these rules, whatever the model.

"qwen2_vl" — Qwen2-VL, Qwen2.5-VL and every model whose ``preprocessor_config.json`` names
  the ``Qwen2VLImageProcessor`` (also ``…Fast`` / ``…Pil``; Qwen3-VL ships it), or whose
  ``config.json`` has ``model_type`` ``qwen2_vl`` / ``qwen2_5_vl``. Inputs from
  ``preprocessor_config.json``: ``patch_size`` p (14), ``merge_size`` m (2), ``min_pixels``
  (3136 = 56²), ``max_pixels`` (12845056 for ``qwen2_vl``, else 1003520 = 28²·1280, the
  transformers default); ``size: {"shortest_edge": min, "longest_edge": max}`` is read too,
  top-level ``min_pixels`` / ``max_pixels`` win over it as in transformers. With f = p·m,
  the image is resized as transformers' ``smart_resize(h, w, f, min_pixels, max_pixels)``:
      h̄ = round(h / f)·f,  w̄ = round(w / f)·f          (Python's round: half to even)
      if h̄·w̄ > max_pixels: β = √(h·w / max_pixels), h̄ = max(f, ⌊h / β / f⌋·f), same for w̄
      elif h̄·w̄ < min_pixels: β = √(min_pixels / (h·w)), h̄ = ⌈h·β / f⌉·f, same for w̄
  tokens = (h̄/p)·(w̄/p) / m² + 2  (the 2 are <|vision_start|> and <|vision_end|>).
  Unknown size, or an aspect ratio over 200 (which the server rejects): the worst case,
  ⌊max_pixels / f²⌋ + 2 (1282 for the 1003520 default, 16386 for 12845056).

"llava" — LLaVA-1.5 style: ``config.json`` ``model_type`` ``llava`` with a CLIP vision tower
  (``vision_config.model_type`` ``clip_vision_model`` or absent) that states ``image_size`` s
  and ``patch_size`` p: every image costs (s // p)², whatever its size (576 for 336/14), plus
  one for the CLS token when ``vision_feature_select_strategy`` is ``full``.

Not exact (the defaults, ``exact == ""``): llava_next / llava_onevision (anyres tiling),
  LLaVA with another vision tower (Pixtral, SigLIP), a LLaVA config without ``image_size`` /
  ``patch_size``, and every other model type. Server-side overrides (vLLM's
  ``--mm-processor-kwargs``, per-request ``mm_processor_kwargs``) are not seen.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import math
import urllib.parse
import warnings
import wave
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ext_proc.policy.model import MediaSpec

__all__ = [
    "MediaCost",
    "MediaKind",
    "MediaModelError",
    "MediaPart",
    "audio_seconds",
    "image_size",
    "media_cost",
    "part_of",
]

MediaKind = Literal["image", "audio", "video"]

# Base64 characters decoded to read a header, tried in turn (multiples of 4: 3 and 48 KiB
# of data); the whole payload is decoded only when neither holds the header.
_PREFIX_B64_CHARS = (4 * 1024, 64 * 1024)
_MAX_ASPECT_RATIO = 200  # transformers' smart_resize rejects wider or taller images

_QWEN_PROCESSORS = frozenset(
    {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil"}
)
_QWEN_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
_QWEN_MIN_PIXELS = 56 * 56
_QWEN_MAX_PIXELS = 28 * 28 * 1280  # transformers' default, used when a file is silent
_QWEN2_MAX_PIXELS = 12845056  # Qwen2-VL's published preprocessor_config.json
_QWEN_SPECIAL_TOKENS = 2  # <|vision_start|> … <|vision_end|>

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
_WAV_FORMATS = frozenset({"wav", "wave", "x-wav", "vnd.wave"})


class MediaModelError(ValueError):
    """``model_dir`` is unreadable or its processor settings are invalid; says file and why."""


@dataclass(frozen=True, slots=True)
class MediaPart:
    """One non-text part: its kind and what its data says about its size (``None``: unknown)."""

    kind: MediaKind
    width: int | None = None  # pixels
    height: int | None = None  # pixels
    seconds: float | None = None  # audio duration


# --- parts -------------------------------------------------------------------------------


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


# --- reading headers ---------------------------------------------------------------------


def _data_url(url: str) -> tuple[str, bool, int] | None:
    """``data:<media type>[;…][;base64],<payload>`` → (media type, is base64, where the
    payload starts). An index, not a slice: copying a megabyte payload costs more than
    reading its header."""
    if url[:5].lower() != "data:":
        return None
    comma = url.find(",", 5)
    if comma < 0:
        return None
    params = url[5:comma].lower().split(";")
    return params[0].strip(), "base64" in params[1:], comma + 1


def _decodings(text: str, start: int = 0) -> Iterator[bytes]:
    """The base64 in ``text[start:]``, decoded as growing prefixes (3 KiB, 48 KiB) and then
    whole; the caller stops at the first it can read. Decoding is the cost (~2 µs per KiB)."""
    for chars in _PREFIX_B64_CHARS:
        prefix = text[start : start + chars]
        try:
            head: bytes | None = base64.b64decode(prefix)
        except (binascii.Error, ValueError):
            head = None  # e.g. line breaks shifted the padding: a longer prefix may decode
        if head is not None:
            yield head
        if start + chars >= len(text):
            return
    yield base64.b64decode(text[start:])


def image_size(url_or_b64: str, *, base64_data: bool = False) -> tuple[int, int] | None:
    """(width, height) from the header bytes of a data: URL, or of raw base64 when
    ``base64_data``: PNG, JPEG, WebP, GIF (the bytes decide, not the declared media type).

    ``None`` for http(s) and other non-data URLs, unreadable data and other formats.
    """
    try:
        if base64_data:
            return _first_size(_decodings(url_or_b64))
        parsed = _data_url(url_or_b64)
        if parsed is None:
            return None
        _, is_base64, start = parsed
        if is_base64:
            return _first_size(_decodings(url_or_b64, start))
        return _first_size(iter([urllib.parse.unquote_to_bytes(url_or_b64[start:])]))
    except Exception:
        return None


def _first_size(decodings: Iterator[bytes]) -> tuple[int, int] | None:
    """The size from the first decoding whose header reads; stops at an unknown format."""
    for data in decodings:
        fmt = _sniff(data)
        if fmt is None:
            return None  # the magic bytes are at the start: more data will not help
        size = _webp_size(data) if fmt == "WEBP" else _pillow_size(data, fmt)
        if size is not None:
            return size
    return None


def _sniff(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _valid(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None


def _pillow_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """Let Pillow's format plugin read the header; ``None`` when the header is cut off.

    The plugin class is used directly rather than ``Image.open``: only these formats are
    tried, and no decompression-bomb check refuses (or warns about) a huge declared size.
    """
    from PIL import GifImagePlugin, Image, ImageFile, JpegImagePlugin, PngImagePlugin

    plugins: dict[str, type[ImageFile.ImageFile]] = {
        "PNG": PngImagePlugin.PngImageFile,
        "JPEG": JpegImagePlugin.JpegImageFile,
        "GIF": GifImagePlugin.GifImageFile,
    }
    try:
        with warnings.catch_warnings():
            # GIF frames larger than the screen are bomb-checked inside the plugin.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with plugins[fmt](io.BytesIO(data)) as im:
                width, height = im.size
    except Exception:  # truncated header (SyntaxError, OSError, EOFError, …) or a bomb error
        return None
    return _valid(width, height)


def _webp_size(data: bytes) -> tuple[int, int] | None:
    """The canvas size from a WebP's first chunk header (RFC 9649 §2.5–2.7).

    Read by hand: Pillow's WebP reader builds a decoder and allocates the canvas on open.
    """
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF  # top 2 bits: upscaling
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return _valid(width, height)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return _valid((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return _valid(width, height)
    return None


def audio_seconds(data_b64: str, fmt: str) -> float | None:
    """Duration of base64 audio when its header says: PCM WAV (read by the stdlib ``wave``).

    ``fmt`` is the part's format (``wav``, or a media type such as ``audio/wav``). ``None``
    for other formats (mp3, …) and unreadable data. A header that declares more frames than
    the payload holds (streamed WAVs write 0xFFFFFFFF) is capped at what the payload holds.
    """
    return _audio_seconds(data_b64, 0, fmt)


def _audio_seconds(text: str, start: int, fmt: str) -> float | None:
    try:
        if fmt.strip().lower().removeprefix("audio/") not in _WAV_FORMATS:
            return None
        payload_bytes = (len(text) - start) * 3 // 4 - _padding(text)
        for data in _decodings(text, start):
            try:
                with wave.open(io.BytesIO(data), "rb") as w:
                    frames, rate = w.getnframes(), w.getframerate()
                    frame_bytes = w.getnchannels() * w.getsampwidth()
            except (wave.Error, EOFError, ValueError):
                continue  # cut off before the data chunk: try a longer prefix
            if rate <= 0 or frame_bytes <= 0:
                return None
            return min(frames, payload_bytes // frame_bytes) / rate
    except Exception:
        return None
    return None


def _padding(text: str) -> int:
    return 2 if text.endswith("==") else 1 if text.endswith("=") else 0


# --- costs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _QwenGrid:
    """Qwen2-VL's image processor settings (see the module docstring for the formula)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """transformers' ``smart_resize``: the same float operations in the same order, so
        that rounding at the boundaries agrees (the caller keeps the aspect ratio ≤ 200)."""
        factor = self.patch_size * self.merge_size
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def tokens(self, width: int | None, height: int | None) -> int:
        if width is None or height is None or width <= 0 or height <= 0:
            return self.worst_tokens()
        if max(width, height) / min(width, height) > _MAX_ASPECT_RATIO:
            return self.worst_tokens()
        h_bar, w_bar = self.resized(height, width)
        grid = (h_bar // self.patch_size) * (w_bar // self.patch_size)
        return grid // (self.merge_size**2) + _QWEN_SPECIAL_TOKENS

    def worst_tokens(self) -> int:
        factor = self.patch_size * self.merge_size
        return self.max_pixels // (factor * factor) + _QWEN_SPECIAL_TOKENS


@dataclass(frozen=True, slots=True)
class MediaCost:
    """Prices ``MediaPart``s for one ``MediaSpec``; build it with ``media_cost``."""

    spec: MediaSpec
    exact: str = ""  # "qwen2_vl" | "llava" | "" (the profile's defaults)
    qwen: _QwenGrid | None = None
    image_tokens_fixed: int | None = None  # llava: every image costs this

    def tokens(self, part: MediaPart) -> int:
        """The prompt tokens ``part`` takes; always ≥ 1."""
        return max(1, self._tokens(part))

    def _tokens(self, part: MediaPart) -> int:
        spec = self.spec
        if part.kind == "image":
            if self.qwen is not None:
                return self.qwen.tokens(part.width, part.height)
            if self.image_tokens_fixed is not None:
                return self.image_tokens_fixed
            return spec.tokens_per_image
        if part.kind == "audio":
            s = part.seconds
            if s is not None and math.isfinite(s) and s >= 0:
                return math.ceil(s * spec.tokens_per_audio_second)
            return spec.tokens_per_audio
        return spec.tokens_per_video


@functools.lru_cache(maxsize=64)
def media_cost(spec: MediaSpec) -> MediaCost:
    """The ``MediaCost`` for ``spec``, built once per spec (the folder is read once).

    Raises ``MediaModelError`` naming the file and the problem when ``spec.model_dir`` is
    set but is not a folder, holds neither ``preprocessor_config.json`` nor ``config.json``,
    or one of them is unreadable, not a JSON object, or has invalid processor settings.
    """
    if not spec.model_dir:
        return MediaCost(spec)
    folder = Path(spec.model_dir)
    if not folder.is_dir():
        raise MediaModelError(f"{folder}: not a folder")
    pre_path, cfg_path = folder / "preprocessor_config.json", folder / "config.json"
    pre, cfg = _json_object(pre_path), _json_object(cfg_path)
    if pre is None and cfg is None:
        raise MediaModelError(f"{folder}: holds neither preprocessor_config.json nor config.json")
    pre, cfg = pre or {}, cfg or {}
    model_type = cfg.get("model_type")
    if pre.get("image_processor_type") in _QWEN_PROCESSORS or model_type in _QWEN_MODEL_TYPES:
        qwen2 = model_type == "qwen2_vl" or pre.get("processor_class") == "Qwen2VLProcessor"
        where = pre_path if pre_path.is_file() else cfg_path
        return MediaCost(spec, "qwen2_vl", qwen=_qwen_grid(pre, qwen2, where))
    if model_type == "llava":
        fixed = _llava_image_tokens(cfg, cfg_path)
        if fixed is not None:
            return MediaCost(spec, "llava", image_tokens_fixed=fixed)
    return MediaCost(spec)


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` when there is no such file."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise MediaModelError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise MediaModelError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise MediaModelError(f"{path}: must hold a JSON object")
    return value


def _positive_int(value: Any, what: str, where: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MediaModelError(f"{where}: {what} must be a positive integer, got {value!r}")
    return value


def _qwen_grid(pre: Mapping[str, Any], qwen2: bool, where: Path) -> _QwenGrid:
    size = pre.get("size")
    size = size if isinstance(size, Mapping) else {}
    # Precedence as in transformers: min_pixels / max_pixels, then size's edges.
    min_pixels = pre.get("min_pixels", size.get("shortest_edge", size.get("min_pixels")))
    max_pixels = pre.get("max_pixels", size.get("longest_edge", size.get("max_pixels")))
    if min_pixels is None:
        min_pixels = _QWEN_MIN_PIXELS
    if max_pixels is None:
        max_pixels = _QWEN2_MAX_PIXELS if qwen2 else _QWEN_MAX_PIXELS
    grid = _QwenGrid(
        patch_size=_positive_int(pre.get("patch_size", 14), "patch_size", where),
        merge_size=_positive_int(pre.get("merge_size", 2), "merge_size", where),
        min_pixels=_positive_int(min_pixels, "min_pixels", where),
        max_pixels=_positive_int(max_pixels, "max_pixels", where),
    )
    factor = grid.patch_size * grid.merge_size
    if grid.max_pixels < factor * factor:
        raise MediaModelError(
            f"{where}: max_pixels {grid.max_pixels} is less than one merged patch "
            f"({factor}×{factor} pixels)"
        )
    if grid.min_pixels > grid.max_pixels:
        raise MediaModelError(
            f"{where}: min_pixels {grid.min_pixels} exceeds max_pixels {grid.max_pixels}"
        )
    return grid


def _llava_image_tokens(cfg: Mapping[str, Any], where: Path) -> int | None:
    """(image_size // patch_size)² for a CLIP-towered LLaVA; ``None`` when not modelled."""
    vision = cfg.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        return None  # Pixtral, SigLIP, …: other token rules
    if "image_size" not in vision or "patch_size" not in vision:
        return None  # would mean CLIP's defaults: do not guess
    image = _positive_int(vision["image_size"], "vision_config.image_size", where)
    patch = _positive_int(vision["patch_size"], "vision_config.patch_size", where)
    if patch > image:
        raise MediaModelError(f"{where}: vision_config.patch_size {patch} exceeds image_size")
    strategy = cfg.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise MediaModelError(
            f"{where}: vision_feature_select_strategy must be 'default' or 'full', got {strategy!r}"
        )
    patches = (image // patch) ** 2
    return patches if strategy == "default" else patches + 1  # "full" keeps the CLS token
