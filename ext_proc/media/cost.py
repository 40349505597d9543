"""What a media part costs in prompt tokens: the model's own processor (Qwen2-VL family,
LLaVA-1.5) or the profile's defaults (``ext_proc.media``).

An image whose header cannot be trusted (no size read from it: a format ICE does not read,
a header cut off, a side of 0; or an aspect ratio the server refuses) is charged its *byte
bound*: the most tokens an image of that many bytes can cost under the profile's media
settings (tokens):

    byte_bound = qwen2_vl: ⌊max_pixels / f²⌋ + 2   (f = patch_size × merge_size, pixels)
                 llava:    (s // p)² (+1 with the "full" strategy)
                 defaults: tokens_per_image

The per-image default stands in for a processor ICE does not know; with a known processor,
its largest count is exact, and the default (even if larger) does not apply. The bound does
not shrink with the byte count: among the formats vLLM 0.32 opens
(``vllm/multimodal/image.py``, ``ALLOWED_IMAGE_FORMATS``) no finite pixels-per-byte ceiling
holds (a GIF's logical screen costs 4 bytes whatever its size, TIFF strips may share one
run of bytes, a WebP lossless code of one symbol costs 0 bits per pixel), so a few hundred
bytes can already carry an image at the processor's ``max_pixels``. For PNG, JPEG, GIF and
WebP the header ICE reads is the one vLLM's decoder (the same Pillow classes, libwebp's
canvas) sizes the image by, read as they read it (``ext_proc.media.walks``), so a size read
from it is trusted. A header ICE could not reach in bounded work (past the decoded prefix,
or a walk of more than ``walks.MAX_STEPS`` markers, blocks or chunks) is one it cannot
trust: the byte bound."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ext_proc.media.parts import MediaPart
from ext_proc.media.spec import MediaSpec

__all__ = ["MediaCost", "MediaModelError", "media_cost"]

_MAX_ASPECT_RATIO = 200  # transformers' smart_resize rejects wider or taller images

_QWEN_PROCESSORS = frozenset(
    {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil"}
)
_QWEN_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
_QWEN_MIN_PIXELS = 56 * 56
_QWEN_MAX_PIXELS = 28 * 28 * 1280  # transformers' default, used when a file is silent
_QWEN2_MAX_PIXELS = 12845056  # Qwen2-VL's published preprocessor_config.json
_QWEN_SPECIAL_TOKENS = 2  # <|vision_start|> … <|vision_end|>


class MediaModelError(ValueError):
    """``model_dir`` is unreadable or its processor settings are invalid; says file and why."""


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
            w, h = part.width, part.height
            if w is None or h is None or w <= 0 or h <= 0:
                return self.image_byte_bound()  # no size to trust
            if self.qwen is not None:
                if max(w, h) / min(w, h) > _MAX_ASPECT_RATIO:
                    return self.image_byte_bound()
                return self.qwen.tokens(w, h)
            if self.image_tokens_fixed is not None:
                return self.image_tokens_fixed
            return spec.tokens_per_image
        if part.kind == "audio":
            s = part.seconds
            if s is not None and math.isfinite(s) and s >= 0:
                return math.ceil(s * spec.tokens_per_audio_second)
            return spec.tokens_per_audio
        return spec.tokens_per_video

    def image_byte_bound(self) -> int:
        """Tokens of an image whose header cannot be trusted (the module docstring)."""
        if self.qwen is not None:
            return self.qwen.worst_tokens()
        if self.image_tokens_fixed is not None:
            return self.image_tokens_fixed
        return self.spec.tokens_per_image


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
