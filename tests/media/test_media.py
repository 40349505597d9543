"""media: what image, audio and video parts cost in prompt tokens, and reading their headers."""

from __future__ import annotations

import base64
import io
import json
import random
import struct
import subprocess
import sys
import urllib.parse
import wave
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from ext_proc import media
from ext_proc.media import (
    MediaCost,
    MediaModelError,
    MediaPart,
    audio_seconds,
    image_size,
    media_cost,
    part_of,
)
from ext_proc.media.spec import MediaSpec

QWEN2_MAX = 12845056  # Qwen2-VL's published max_pixels
QWEN25_MAX = 28 * 28 * 1280  # 1003520, transformers' default


# --- helpers -----------------------------------------------------------------------------


def _image_bytes(fmt: str, size: tuple[int, int], mode: str = "RGB", **save: Any) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (10, 20, 30, 40)[: len(mode)]).save(buf, fmt, **save)
    return buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{_b64(data)}"


def _wav(seconds: float, rate: int = 16000, channels: int = 1, sampwidth: int = 2) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        w.writeframes(b"\0" * (round(seconds * rate) * channels * sampwidth))
    return buf.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG declaring ``width``×``height``: IHDR and an empty IDAT, no pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", b"")


def _gif_header_only(screen: tuple[int, int], frame: tuple[int, int]) -> bytes:
    """A GIF with a logical screen and one frame descriptor of the given sizes, no pixels."""
    head = b"GIF89a" + struct.pack("<HHBBB", *screen, 0, 0, 0)
    return head + b"," + struct.pack("<HHHHB", 0, 0, *frame, 0) + b"\x02\x00;"


def _jpeg_with_app_segments(size: tuple[int, int], total_bytes: int) -> bytes:
    """A JPEG whose SOF comes after ``total_bytes`` of APP1 segments (each ≤ 64 KiB)."""
    jpeg = _image_bytes("JPEG", size)
    segments = b""
    left = total_bytes
    while left > 0:
        n = min(left, 60000)
        segments += b"\xff\xe1" + struct.pack(">H", n + 2) + b"X" * n
        left -= n
    return jpeg[:2] + segments + jpeg[2:]


def _model_dir(tmp_path: Path, **files: Mapping[str, Any] | str) -> Path:
    """A model folder holding ``preprocessor_config`` / ``config`` (dicts, or raw text)."""
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    for stem, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (folder / f"{stem}.json").write_text(text, "utf-8")
    return folder


def _qwen_pre(**settings: Any) -> dict[str, Any]:
    return {"image_processor_type": "Qwen2VLImageProcessor", **settings}


def _cost(folder: Path, spec: MediaSpec | None = None) -> MediaCost:
    base = spec or MediaSpec()
    return media_cost(
        MediaSpec(
            model_dir=str(folder),
            tokens_per_image=base.tokens_per_image,
            tokens_per_audio_second=base.tokens_per_audio_second,
            tokens_per_audio=base.tokens_per_audio,
            tokens_per_video=base.tokens_per_video,
        )
    )


def _image(width: int | None, height: int | None) -> MediaPart:
    return MediaPart("image", width=width, height=height)


# --- the public interface ----------------------------------------------------------------


def test_public_names_are_the_documented_interface() -> None:
    assert set(media.__all__) == {
        "MediaCost",
        "MediaKind",
        "MediaModelError",
        "MediaPart",
        "audio_seconds",
        "image_size",
        "media_cost",
        "part_of",
    }


def test_importing_the_module_does_not_load_pillow() -> None:
    code = (
        "import sys, ext_proc.media as m; "
        "m.part_of({'type': 'text', 'text': 'hi'}); "
        "m.part_of({'type': 'image_url', 'image_url': {'url': 'https://x/y.png'}}); "
        "print('PIL' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- default costs -----------------------------------------------------------------------

CUSTOM = MediaSpec(
    tokens_per_image=999, tokens_per_audio_second=10.0, tokens_per_audio=333, tokens_per_video=7777
)


@pytest.mark.parametrize(
    ("spec", "part", "tokens"),
    [
        (MediaSpec(), MediaPart("image"), 576),
        (MediaSpec(), _image(4000, 3000), 576),
        (CUSTOM, _image(224, 224), 999),
        (MediaSpec(), MediaPart("audio", seconds=2.0), 50),  # 2.0 s × 25 tokens/s
        (MediaSpec(), MediaPart("audio", seconds=2.01), 51),  # ⌈50.25⌉
        (CUSTOM, MediaPart("audio", seconds=3.0), 30),
        (MediaSpec(), MediaPart("audio"), 750),
        (CUSTOM, MediaPart("audio"), 333),
        (MediaSpec(), MediaPart("audio", seconds=float("nan")), 750),
        (MediaSpec(), MediaPart("audio", seconds=-1.0), 750),
        (MediaSpec(), MediaPart("audio", seconds=0.0), 1),  # never free
        (MediaSpec(), MediaPart("audio", seconds=0.001), 1),  # ⌈0.025⌉
        (MediaSpec(), MediaPart("video"), 4096),
        (CUSTOM, MediaPart("video"), 7777),
    ],
    ids=[
        "image-default",
        "image-size-ignored",
        "image-custom",
        "audio-by-seconds",
        "audio-seconds-rounded-up",
        "audio-custom-rate",
        "audio-unknown-length",
        "audio-unknown-length-custom",
        "audio-nan-seconds-unknown",
        "audio-negative-seconds-unknown",
        "audio-zero-seconds-costs-one",
        "audio-tiny-costs-one",
        "video-default",
        "video-custom",
    ],
)
def test_default_costs_without_a_model(spec: MediaSpec, part: MediaPart, tokens: int) -> None:
    cost = media_cost(spec)
    assert cost.exact == ""
    assert cost.tokens(part) == tokens


def test_media_cost_is_built_once_per_spec(tmp_path: Path) -> None:
    folder = _model_dir(tmp_path, preprocessor_config=_qwen_pre())
    spec = MediaSpec(model_dir=str(folder))
    first = media_cost(spec)
    (folder / "preprocessor_config.json").unlink()
    folder.rmdir()  # a second read would now fail
    assert media_cost(MediaSpec(model_dir=str(folder))) is first


# --- Qwen2-VL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_pixels", "width", "height", "tokens"),
    [
        # 224/28 = 8 → h̄ = w̄ = 224, within [3136, max]; (224/14)² = 256 patches / 2² = 64, + 2
        (QWEN2_MAX, 224, 224, 66),
        # 448/28 = 16 → 448; (448/14)² = 1024 / 4 = 256, + 2
        (QWEN2_MAX, 448, 448, 258),
        # h: 500/28 = 17.86 → 18 → 504; w: 1000/28 = 35.71 → 36 → 1008;
        # (504/14)·(1008/14) = 36·72 = 2592 / 4 = 648, + 2
        (QWEN2_MAX, 1000, 500, 650),
        # round half to even: h: 42/28 = 1.5 → 2 → 56; w: 70/28 = 2.5 → 2 → 56;
        # 56·56 = 3136 is not < min_pixels; 4·4 = 16 / 4 = 4, + 2 (half-up rounding: 8)
        (QWEN2_MAX, 70, 42, 6),
        # min clamp: h̄ = round(10/28)·28 = 0 → 0 < 3136; β = √(3136/300) = 3.233;
        # h̄ = ⌈10·3.233/28⌉·28 = ⌈1.15⌉·28 = 56, w̄ = ⌈30·3.233/28⌉·28 = ⌈3.46⌉·28 = 112;
        # 4·8 = 32 / 4 = 8, + 2
        (QWEN2_MAX, 30, 10, 10),
        # max clamp: 3000 → 107·28 = 2996, 4000 → 143·28 = 4004; 2996·4004 > 1003520;
        # β = √(12e6/1003520) = 3.458; h̄ = ⌊3000/3.458/28⌋·28 = ⌊30.98⌋·28 = 840,
        # w̄ = ⌊4000/3.458/28⌋·28 = ⌊41.31⌋·28 = 1148; 60·82 = 4920 / 4 = 1230, + 2
        (QWEN25_MAX, 4000, 3000, 1232),
        # the same image under Qwen2's larger limit: 2996·4004 ≤ 12845056, no clamp;
        # 214·286 = 61204 / 4 = 15301, + 2
        (QWEN2_MAX, 4000, 3000, 15303),
        # rounding overshoots the limit: 1000/28 = 35.7 → 1008, 1008² = 1016064 > 1003520;
        # β = √(1e6/1003520) = 0.9982; ⌊1000/0.9982/28⌋ = ⌊35.78⌋ = 35 → 980;
        # 70·70 = 4900 / 4 = 1225, + 2
        (QWEN25_MAX, 1000, 1000, 1227),
    ],
    ids=[
        "224-square",
        "448-square",
        "1000x500-rounds-up",
        "round-half-to-even",
        "min-pixels-clamp",
        "max-pixels-clamp",
        "qwen2-limit-no-clamp",
        "rounding-over-max-clamps",
    ],
)
def test_qwen2_vl_image_tokens_by_hand(
    tmp_path: Path, max_pixels: int, width: int, height: int, tokens: int
) -> None:
    folder = _model_dir(
        tmp_path,
        preprocessor_config=_qwen_pre(
            min_pixels=3136, max_pixels=max_pixels, patch_size=14, merge_size=2
        ),
    )
    cost = _cost(folder)
    assert cost.exact == "qwen2_vl"
    assert cost.tokens(_image(width, height)) == tokens


@pytest.mark.parametrize(
    ("files", "worst"),
    [
        ({"preprocessor_config": _qwen_pre(max_pixels=QWEN2_MAX)}, 16384 + 2),  # 12845056 / 28²
        ({"preprocessor_config": _qwen_pre()}, 1280 + 2),  # transformers' default 1003520
        ({"preprocessor_config": _qwen_pre(max_pixels=28 * 28 * 256)}, 256 + 2),
        ({"config": {"model_type": "qwen2_vl"}}, 16384 + 2),
        ({"config": {"model_type": "qwen2_5_vl"}}, 1280 + 2),
        (
            {
                "preprocessor_config": {
                    "image_processor_type": "Qwen2VLImageProcessorFast",
                    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                    "patch_size": 16,
                },
                "config": {"model_type": "qwen3_vl"},
            },
            16384 + 2,  # 16777216 / 32²
        ),
        (
            {
                "preprocessor_config": _qwen_pre(
                    size={"shortest_edge": 3136, "longest_edge": QWEN2_MAX}, max_pixels=200704
                )
            },
            256 + 2,  # top-level max_pixels wins over size, as in transformers
        ),
        (
            {"preprocessor_config": _qwen_pre(processor_class="Qwen2VLProcessor")},
            16384 + 2,  # a Qwen2-VL processor without max_pixels: Qwen2's limit
        ),
    ],
    ids=[
        "qwen2-file",
        "no-max-pixels-transformers-default",
        "small-max-pixels",
        "config-only-qwen2",
        "config-only-qwen2-5",
        "size-dict-and-patch-16",
        "max-pixels-beats-size",
        "qwen2-processor-class-default",
    ],
)
def test_qwen2_vl_unknown_size_is_the_worst_case(
    tmp_path: Path, files: dict[str, Mapping[str, Any]], worst: int
) -> None:
    cost = _cost(_model_dir(tmp_path, **files))
    assert cost.exact == "qwen2_vl"
    assert cost.tokens(MediaPart("image")) == worst
    assert cost.tokens(_image(None, 480)) == worst
    assert cost.tokens(_image(0, 480)) == worst
    assert cost.tokens(_image(10_000, 10)) == worst  # aspect 1000 > 200: the server rejects it


def test_qwen2_vl_known_sizes_never_exceed_the_worst_case(tmp_path: Path) -> None:
    cost = _cost(_model_dir(tmp_path, preprocessor_config=_qwen_pre()))
    worst = cost.tokens(MediaPart("image"))
    rng = random.Random(11)
    counts = []
    for _ in range(3000):
        w = rng.randint(1, 9000)
        h = rng.randint(max(1, w // 200 + 1), min(9000, w * 200))
        counts.append(cost.tokens(_image(w, h)))
    assert max(counts) <= worst
    assert min(counts) >= 4 + 2  # min_pixels 3136 = 56² is at least 2·2 merged patches


def _transformers_smart_resize() -> Callable[..., tuple[int, int]]:
    pytest.importorskip("transformers")
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    except ImportError:  # the torchvision backend needs torchvision; the PIL one does not
        module = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
        smart_resize = module.smart_resize
    return smart_resize


def test_qwen2_vl_tokens_agree_with_transformers_smart_resize(tmp_path: Path) -> None:
    smart_resize = _transformers_smart_resize()
    rng = random.Random(5)
    sizes = [(rng.randint(1, 6000), rng.randint(1, 6000)) for _ in range(1500)]
    sizes += [
        (14 * a + d, 14 * b + e)
        for a in range(1, 80, 3)
        for b in (1, 2, 3, 40, 81)
        for d in (-1, 0, 1)
        for e in (0, 1)
    ]
    sizes += [(1, 1), (1, 199), (3, 600), (56, 56), (28, 28), (8192, 8192), (20000, 100)]
    settings = [(14, 2, 3136, QWEN25_MAX), (14, 2, 3136, QWEN2_MAX), (16, 2, 65536, 16777216)]
    settings += [(14, 2, 200704, 401408), (14, 1, 784, 200704)]
    checked = 0
    for i, (patch, merge, min_pixels, max_pixels) in enumerate(settings):
        folder = _model_dir(
            tmp_path / str(i),
            preprocessor_config=_qwen_pre(
                patch_size=patch, merge_size=merge, min_pixels=min_pixels, max_pixels=max_pixels
            ),
        )
        cost = _cost(folder)
        for w, h in sizes:
            if w < 1 or h < 1 or max(w, h) / min(w, h) > 200:
                continue
            h_bar, w_bar = smart_resize(h, w, patch * merge, min_pixels, max_pixels)
            expected = (h_bar // patch) * (w_bar // patch) // (merge * merge) + 2
            assert cost.tokens(_image(w, h)) == expected, (w, h, patch, merge, max_pixels)
            checked += 1
    assert checked > 5000


@pytest.mark.parametrize(
    "pre",
    [
        _qwen_pre(min_pixels=3136, max_pixels=QWEN2_MAX, patch_size=14, merge_size=2),
        _qwen_pre(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16),
        _qwen_pre(size={"shortest_edge": 65536, "longest_edge": 16777216}, min_pixels=3136),
        _qwen_pre(),
    ],
    ids=["min-max-pixels", "size-dict", "min-pixels-beats-size", "class-defaults"],
)
def test_qwen2_vl_settings_read_as_transformers_processor_reads_them(
    tmp_path: Path, pre: dict[str, Any]
) -> None:
    module = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    folder = _model_dir(tmp_path, preprocessor_config=pre)
    processor = module.Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    cost = _cost(folder)
    for w, h in [(224, 224), (1000, 500), (30, 10), (4000, 3000), (250, 4500), (8000, 8000)]:
        patches = processor.get_number_of_image_patches(h, w)
        assert cost.tokens(_image(w, h)) == patches // processor.merge_size**2 + 2, (w, h)


# --- LLaVA and models that are not modelled ---------------------------------------------


def _llava(**vision: Any) -> dict[str, Any]:
    return {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model", **vision}}


@pytest.mark.parametrize(
    ("config", "exact", "tokens"),
    [
        (_llava(image_size=336, patch_size=14), "llava", 576),  # (336/14)² = 24²
        (
            {**_llava(image_size=336, patch_size=14), "vision_feature_select_strategy": "default"},
            "llava",
            576,
        ),
        (
            {**_llava(image_size=336, patch_size=14), "vision_feature_select_strategy": "full"},
            "llava",
            577,  # the CLS token is kept
        ),
        (_llava(image_size=224, patch_size=32), "llava", 49),  # (224 // 32)² = 7²
        (
            {"model_type": "llava", "vision_config": {"image_size": 448, "patch_size": 14}},
            "llava",
            1024,  # no tower model_type: LLaVA's default, CLIP
        ),
        (_llava(image_size=336), "", 999),  # no patch_size: not guessed
        (
            {"model_type": "llava", "vision_config": {"model_type": "pixtral", "image_size": 1024}},
            "",
            999,
        ),
        (
            {
                "model_type": "llava",
                "vision_config": {"model_type": "siglip_vision_model", "image_size": 384},
            },
            "",
            999,
        ),
        ({"model_type": "llava"}, "", 999),
        (
            {
                "model_type": "llava_next",
                "vision_config": {"model_type": "clip_vision_model", "image_size": 336},
            },
            "",
            999,
        ),
        ({"model_type": "llava_onevision"}, "", 999),
        ({"model_type": "llama"}, "", 999),
        ({"model_type": "qwen3_vl"}, "", 999),  # config only: patch size unknown
    ],
    ids=[
        "llava-1.5-336",
        "llava-default-strategy",
        "llava-full-strategy",
        "llava-224-32",
        "llava-tower-type-absent",
        "llava-no-patch-size",
        "llava-pixtral-tower",
        "llava-siglip-tower",
        "llava-no-vision-config",
        "llava-next-anyres",
        "llava-onevision",
        "text-only-model",
        "qwen3-vl-config-only",
    ],
)
def test_image_cost_by_config_json(
    tmp_path: Path, config: dict[str, Any], exact: str, tokens: int
) -> None:
    cost = _cost(_model_dir(tmp_path, config=config), CUSTOM)
    assert cost.exact == exact
    assert cost.tokens(MediaPart("image")) == tokens
    assert cost.tokens(_image(1920, 1080)) == tokens


def test_audio_and_video_keep_the_defaults_with_a_model(tmp_path: Path) -> None:
    cost = _cost(_model_dir(tmp_path, preprocessor_config=_qwen_pre()), CUSTOM)
    assert cost.tokens(MediaPart("audio", seconds=3.0)) == 30
    assert cost.tokens(MediaPart("audio")) == 333
    assert cost.tokens(MediaPart("video")) == 7777


def test_a_non_qwen_preprocessor_defers_to_config_json(tmp_path: Path) -> None:
    folder = _model_dir(
        tmp_path,
        preprocessor_config={"image_processor_type": "CLIPImageProcessor", "crop_size": 336},
        config=_llava(image_size=336, patch_size=14),
    )
    assert _cost(folder, CUSTOM).exact == "llava"


# --- MediaModelError ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({}, "holds neither preprocessor_config.json nor config.json"),
        ({"config": "{not json"}, "config.json: not valid JSON"),
        ({"preprocessor_config": "[1, 2]"}, "preprocessor_config.json: must hold a JSON object"),
        ({"preprocessor_config": _qwen_pre(patch_size="14")}, "patch_size must be a positive"),
        ({"preprocessor_config": _qwen_pre(merge_size=0)}, "merge_size must be a positive"),
        ({"preprocessor_config": _qwen_pre(max_pixels=True)}, "max_pixels must be a positive"),
        ({"preprocessor_config": _qwen_pre(max_pixels=700)}, "less than one merged patch"),
        (
            {"preprocessor_config": _qwen_pre(min_pixels=2_000_000, max_pixels=1_000_000)},
            "min_pixels 2000000 exceeds max_pixels 1000000",
        ),
        ({"config": _llava(image_size=-1, patch_size=14)}, "image_size must be a positive"),
        ({"config": _llava(image_size=[336, 336], patch_size=14)}, "image_size must be a positive"),
        ({"config": _llava(image_size=14, patch_size=28)}, "patch_size 28 exceeds image_size"),
        ({"config": _llava(image_size=336, patch_size=14)}, None),
    ],
    ids=[
        "empty-folder",
        "invalid-json",
        "not-an-object",
        "patch-size-string",
        "merge-size-zero",
        "max-pixels-bool",
        "max-pixels-below-one-patch",
        "min-above-max",
        "llava-negative-image-size",
        "llava-list-image-size",
        "llava-patch-over-image",
        "valid-control",
    ],
)
def test_bad_model_folder_raises_naming_file_and_problem(
    tmp_path: Path, files: dict[str, Mapping[str, Any] | str], fragment: str | None
) -> None:
    folder = _model_dir(tmp_path, **files)
    if fragment is None:
        assert _cost(folder).exact == "llava"
        return
    with pytest.raises(MediaModelError, match=str(folder)) as caught:
        _cost(folder)
    assert fragment in str(caught.value)


def test_llava_unknown_feature_strategy_is_an_error(tmp_path: Path) -> None:
    config = {**_llava(image_size=336, patch_size=14), "vision_feature_select_strategy": "cls"}
    with pytest.raises(MediaModelError, match=r"config\.json: vision_feature_select_strategy"):
        _cost(_model_dir(tmp_path, config=config))


@pytest.mark.parametrize("kind", ["missing", "file"], ids=["missing-path", "a-file-not-a-folder"])
def test_model_dir_that_is_not_a_folder_raises(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model"
    if kind == "file":
        path.write_text("{}")
    with pytest.raises(MediaModelError, match="not a folder"):
        media_cost(MediaSpec(model_dir=str(path)))


# --- image_size --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "mode", "save", "chunk"),
    [
        ("PNG", "RGB", {}, None),
        ("JPEG", "RGB", {}, None),
        ("JPEG", "RGB", {"progressive": True}, None),
        ("GIF", "RGB", {}, None),
        ("WEBP", "RGB", {}, b"VP8 "),
        ("WEBP", "RGB", {"lossless": True}, b"VP8L"),
        ("WEBP", "RGBA", {}, b"VP8X"),
    ],
    ids=["png", "jpeg", "jpeg-progressive", "gif", "webp-lossy", "webp-lossless", "webp-extended"],
)
def test_image_size_reads_real_headers(
    fmt: str, mode: str, save: dict[str, Any], chunk: bytes | None
) -> None:
    data = _image_bytes(fmt, (123, 45), mode, **save)
    if chunk is not None:
        assert data[12:16] == chunk  # the WebP layout under test
    assert image_size(_data_url(data, "image/anything")) == (123, 45)
    assert image_size(_b64(data), base64_data=True) == (123, 45)


def test_image_size_of_a_large_png_reads_only_the_header() -> None:
    data = _image_bytes("PNG", (3000, 2000), compress_level=0)
    assert len(data) > 1_000_000
    assert image_size(_data_url(data)) == (3000, 2000)


def test_image_size_finds_sof_after_a_100kb_app_segment() -> None:
    data = _jpeg_with_app_segments((321, 123), 100_000)
    sof = data.find(b"\xff\xc0")
    assert sof > 100_000 > 48 * 1024  # beyond the decoded prefixes: the whole payload is read
    assert image_size(_data_url(data, "image/jpeg")) == (321, 123)
    assert image_size(_b64(data), base64_data=True) == (321, 123)


def test_image_size_reads_a_jpeg_with_a_large_exif() -> None:
    exif = Image.Exif()
    exif[0x010E] = "x" * 60000  # ImageDescription
    buf = io.BytesIO()
    Image.new("RGB", (64, 48)).save(buf, "JPEG", exif=exif.tobytes(), icc_profile=b"\0" * 50000)
    assert image_size(_data_url(buf.getvalue(), "image/jpeg")) == (64, 48)


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (_png_header_only(100_000, 90_000), (100_000, 90_000)),
        (_gif_header_only((65535, 65535), (1, 1)), (65535, 65535)),
        # a frame larger than the screen: Pillow's GIF reader bomb-checks it (warns past
        # 89 Mpx, refuses past 179 Mpx); the warning is silenced, the refusal is "unknown"
        (_gif_header_only((10, 10), (12000, 12000)), (12000, 12000)),
        (_gif_header_only((10, 10), (65535, 65535)), None),
    ],
    ids=["png-9-gigapixels", "gif-65535-screen", "gif-frame-warns", "gif-frame-refused"],
)
def test_image_size_of_a_huge_declared_size_never_raises(
    data: bytes, size: tuple[int, int] | None
) -> None:
    assert image_size(_data_url(data)) == size  # warnings are errors under pytest


def test_image_size_reads_base64_with_line_breaks() -> None:
    data = _image_bytes("PNG", (77, 66))
    wrapped = base64.encodebytes(data).decode()  # a newline every 76 characters
    assert "\n" in wrapped[:4096]
    assert image_size(wrapped, base64_data=True) == (77, 66)


def test_image_size_of_a_percent_encoded_data_url() -> None:
    data = _image_bytes("PNG", (12, 34))
    assert image_size("data:image/png," + urllib.parse.quote_from_bytes(data)) == (12, 34)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/cat.png",
        "http://example.com/cat.png",
        "file:///etc/passwd",
        "",
        "data:image/png;base64",
        "data:image/png;base64,!!!!not base64!!!!",
        "data:image/png;base64,iVBORw0KGgo",
        "data:image/png;base64," + _b64(b"\x89PNG\r\n\x1a\n" + b"\0" * 30),
        "data:image/png;base64," + _b64(b"hello, this is not an image at all"),
        "data:image/bmp;base64," + _b64(_image_bytes("BMP", (10, 10))),
        "data:image/webp;base64," + _b64(b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 20),
        "data:image/png;base64," + _b64(_png_header_only(0, 10)),
    ],
    ids=[
        "https",
        "http",
        "file",
        "empty",
        "data-without-comma",
        "garbage-base64",
        "truncated-png-signature",
        "png-without-ihdr",
        "not-an-image",
        "bmp-unsupported",
        "webp-bad-frame-tag",
        "zero-width",
    ],
)
def test_image_size_is_none_when_unreadable(url: str) -> None:
    assert image_size(url) is None


def test_image_size_never_raises_on_a_non_string() -> None:
    assert image_size(12345) is None  # type: ignore[arg-type]
    assert image_size(None, base64_data=True) is None  # type: ignore[arg-type]


# --- audio_seconds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fmt", "seconds"),
    [
        (_wav(1.5), "wav", 1.5),
        (_wav(0.25, rate=44100, channels=2, sampwidth=3), "wav", 0.25),
        (_wav(30.0, rate=8000), "WAV", 30.0),
        (_wav(2.0), "audio/wav", 2.0),
        (_wav(0.0), "wav", 0.0),
        (_wav(1.0), "mp3", 1.0),  # the decoder reads the bytes, not the label
        (b"ID3\x03\x00" + b"\0" * 100, "mp3", None),
        (b"not a wav file at all, sorry", "wav", None),
        (b"RIFF\0\0\0\0WAVEdata\0\0\0\0", "wav", None),  # data before fmt
    ],
    ids=[
        "mono-16k",
        "stereo-24bit",
        "long-uppercase-format",
        "media-type-format",
        "empty",
        "wav-labelled-mp3-read-as-wav",
        "mp3-bytes",
        "garbage",
        "no-fmt-chunk",
    ],
)
def test_audio_seconds_from_wav_headers(data: bytes, fmt: str, seconds: float | None) -> None:
    result = audio_seconds(_b64(data), fmt)
    if seconds is None:
        assert result is None
    else:
        assert result == pytest.approx(seconds)


def test_audio_seconds_caps_a_streamed_header_at_the_payload() -> None:
    data = bytearray(_wav(1.0))
    assert data[36:40] == b"data"
    data[40:44] = b"\xff\xff\xff\xff"  # streaming writers declare the largest size
    result = audio_seconds(_b64(bytes(data)), "wav")
    assert result is not None
    assert 1.0 <= result <= 1.0 + 44 / 2 / 16000  # at most the header's bytes more


def test_audio_seconds_never_raises_on_garbage() -> None:
    assert audio_seconds("!!!", "wav") is None
    assert audio_seconds(None, "wav") is None  # type: ignore[arg-type]
    assert audio_seconds(_b64(_wav(1.0)), None) == 1.0  # type: ignore[arg-type]  # no label


# --- part_of -----------------------------------------------------------------------------

PNG = _image_bytes("PNG", (40, 30))
PNG_URL = _data_url(PNG)
WAV_B64 = _b64(_wav(2.0))


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        # OpenAI chat
        ({"type": "image_url", "image_url": {"url": PNG_URL}}, _image(40, 30)),
        ({"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}}, _image(40, 30)),
        ({"type": "image_url", "image_url": {"url": "https://x/y.png"}}, MediaPart("image")),
        ({"type": "image_url", "image_url": PNG_URL}, _image(40, 30)),  # vLLM: plain string
        ({"type": "image_url", "image_url": "https://x/y.png"}, MediaPart("image")),
        (
            {"type": "input_audio", "input_audio": {"data": WAV_B64, "format": "wav"}},
            MediaPart("audio", seconds=2.0),
        ),
        (  # WAV bytes labelled mp3: read as the WAV they are
            {"type": "input_audio", "input_audio": {"data": WAV_B64, "format": "mp3"}},
            MediaPart("audio", seconds=2.0),
        ),
        (
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + WAV_B64}},
            MediaPart("audio", seconds=2.0),
        ),
        ({"type": "audio_url", "audio_url": {"url": "https://x/a.mp3"}}, MediaPart("audio")),
        ({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}, MediaPart("video")),
        # vLLM
        ({"type": "image_embeds", "image_embeds": "AAAA"}, MediaPart("image")),
        ({"type": "image_pil", "image_pil": None}, MediaPart("image")),
        # Anthropic
        (
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": _b64(PNG)},
            },
            _image(40, 30),
        ),
        ({"type": "image", "source": {"type": "url", "url": PNG_URL}}, _image(40, 30)),
        ({"type": "image", "source": {"type": "url", "url": "https://x"}}, MediaPart("image")),
        ({"type": "image", "source": {"type": "file", "file_id": "f"}}, MediaPart("image")),
        # OpenAI Responses
        ({"type": "input_image", "image_url": PNG_URL, "detail": "auto"}, _image(40, 30)),
        ({"type": "input_image", "image_url": "https://x/y.png"}, MediaPart("image")),
        ({"type": "input_image", "file_id": "file-1"}, MediaPart("image")),
        # recognised parts with odd insides: media of unknown size
        ({"type": "image_url", "image_url": 5}, MediaPart("image")),
        ({"type": "image_url", "image_url": {"url": 7}}, MediaPart("image")),
        ({"type": "image_url"}, MediaPart("image")),
        ({"type": "image", "source": "oops"}, MediaPart("image")),
        ({"type": "image", "source": {"type": "base64", "data": ["x"]}}, MediaPart("image")),
        ({"type": "input_audio", "input_audio": None}, MediaPart("audio")),
        ({"type": "input_audio", "input_audio": {"data": 5, "format": "wav"}}, MediaPart("audio")),
        ({"type": "input_audio", "input_audio": {"data": WAV_B64}}, MediaPart("audio")),
        ({"type": "audio_url", "audio_url": {"url": "data:audio/wav,abc"}}, MediaPart("audio")),
        ({"type": "video_url", "video_url": 3}, MediaPart("video")),
        # not media
        ({"type": "text", "text": "hello"}, None),
        ({"type": "input_text", "text": "hello"}, None),
        ({"type": "tool_result", "tool_use_id": "t", "content": "ok"}, None),
        ({"type": "document", "source": {"type": "base64", "data": "AAAA"}}, None),
        ({"type": "something_new"}, None),
        ({"type": 3}, None),
        ({}, None),
        # vLLM reads a part without a type, or with a uuid, by its keys
        ({"image_url": PNG_URL}, _image(40, 30)),
        ({"image_url": {"url": PNG_URL}}, _image(40, 30)),
        ({"type": "text", "text": "x", "uuid": "u", "image_url": PNG_URL}, _image(40, 30)),
        ({"type": "input_text", "text": "x", "image_url": "https://x"}, MediaPart("image")),
        ({"audio_url": "https://x/a.wav"}, MediaPart("audio")),
        ({"type": "audio_embeds", "audio_embeds": "AAAA"}, MediaPart("audio")),
        ({"type": "video_embeds", "video_embeds": "AAAA"}, MediaPart("video")),
        ({"uuid": "u", "video_url": "https://x/v.mp4"}, MediaPart("video")),
    ],
    ids=[
        "chat-image-data-url",
        "chat-image-detail",
        "chat-image-https",
        "chat-image-plain-string",
        "chat-image-plain-string-https",
        "chat-input-audio-wav",
        "chat-input-audio-mp3",
        "audio-url-wav-data",
        "audio-url-https",
        "video-url",
        "vllm-image-embeds",
        "vllm-image-pil",
        "anthropic-base64",
        "anthropic-url-data",
        "anthropic-url-https",
        "anthropic-file",
        "responses-input-image-data",
        "responses-input-image-https",
        "responses-input-image-file-id",
        "odd-image-url-int",
        "odd-image-url-url-int",
        "odd-image-url-missing",
        "odd-anthropic-source-str",
        "odd-anthropic-data-list",
        "odd-input-audio-none",
        "odd-input-audio-data-int",
        "odd-input-audio-no-format",
        "odd-audio-url-not-base64",
        "odd-video-url-int",
        "text",
        "responses-input-text",
        "tool-result",
        "anthropic-document",
        "unknown-type",
        "non-string-type",
        "empty",
        "no-type-image-string",
        "no-type-image-object",
        "uuid-text-with-image",
        "text-type-with-image-key",
        "no-type-audio",
        "vllm-audio-embeds",
        "vllm-video-embeds",
        "uuid-video",
    ],
)
def test_part_of_recognises_every_shape(part: dict[str, Any], expected: MediaPart | None) -> None:
    result = part_of(part)
    if expected is not None and expected.seconds is not None:
        assert result is not None
        assert result.kind == expected.kind
        assert result.seconds == pytest.approx(expected.seconds)
    else:
        assert result == expected


@pytest.mark.parametrize(
    "part", [None, "image_url", ["type", "image_url"], 42], ids=["none", "str", "list", "int"]
)
def test_part_of_a_non_mapping_is_not_media(part: Any) -> None:
    assert part_of(part) is None


def test_a_chat_image_part_priced_by_qwen2_vl(tmp_path: Path) -> None:
    cost = _cost(_model_dir(tmp_path, preprocessor_config=_qwen_pre(max_pixels=QWEN2_MAX)))
    part = part_of(
        {"type": "image_url", "image_url": {"url": _data_url(_image_bytes("PNG", (224, 224)))}}
    )
    assert part is not None
    assert cost.tokens(part) == 66
    https = part_of({"type": "image_url", "image_url": {"url": "https://x/y.png"}})
    assert https is not None
    assert cost.tokens(https) == 16386
    assert cost.tokens(MediaPart("audio", seconds=1.0)) == 25
