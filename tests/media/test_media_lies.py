"""Media cost from what the decoder will read: a WAV's length from the bytes present, whatever
its header claims (as FFmpeg, vLLM's first audio decoder, plays it), and an image whose header
cannot be trusted charged its byte bound (hand-computed; ``ext_proc.media.headers`` and
``ext_proc.media.cost``)."""

from __future__ import annotations

import base64
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from ext_proc.media import MediaPart, audio_seconds, media_cost, part_of
from ext_proc.media.spec import MediaSpec

DEFAULT = media_cost(MediaSpec())


def chunk(tag: bytes, body: bytes, size: int | None = None, order: str = "<") -> bytes:
    n = len(body) if size is None else size
    return tag + struct.pack(f"{order}I", n) + body + (b"\0" if len(body) % 2 else b"")


def fmt_chunk(
    tag: int = 1, channels: int = 1, rate: int = 8000, bits: int = 8, order: str = "<"
) -> bytes:
    block = channels * -(-bits // 8)
    return chunk(
        b"fmt ",
        struct.pack(f"{order}HHIIHH", tag, channels, rate, rate * block, block, bits),
        order=order,
    )


def riff(
    *chunks: bytes, magic: bytes = b"RIFF", size: int | None = None, order: str = "<"
) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return magic + struct.pack(f"{order}I", len(body) if size is None else size) + body


def seconds_of(data: bytes, fmt: str = "wav") -> float | None:
    return audio_seconds(base64.b64encode(data).decode(), fmt)


ONE_S = b"\x80" * 8000  # one second at 8 kHz, mono, 8-bit


@pytest.mark.parametrize(
    ("data", "seconds"),
    [
        # the issue's case: a data size of 0 before 600 s of samples: 4,800,000 B / 8,000 B/s
        (riff(fmt_chunk(), chunk(b"data", ONE_S * 600, size=0)), 600.0),
        # and with a RIFF size of 0 too
        (riff(fmt_chunk(), chunk(b"data", ONE_S * 600, size=0), size=0), 600.0),
        # a data size past the end: the 10 s present
        (riff(fmt_chunk(), chunk(b"data", ONE_S * 10, size=8000 * 700)), 10.0),
        # an honest size with 20 s of samples after it (a second data chunk): FFmpeg plays
        # the second, 20 s
        (
            riff(
                fmt_chunk(),
                chunk(b"data", ONE_S),
                chunk(b"LIST", b"INFO"),
                chunk(b"data", ONE_S * 20),
            ),
            20.0,
        ),
        # the byte rate and block align the header claims are not what plays: 16 kHz, 2 ch,
        # 16-bit = 64,000 B/s; 10 s = 640,000 B, data size 0
        (
            riff(
                b"fmt " + struct.pack("<IHHIIHH", 16, 1, 2, 16000, 1, 1, 16),
                chunk(b"data", b"\0" * 640_000, size=0),
            ),
            10.0,
        ),
        # 32-bit IEEE float (tag 3), 16 kHz mono: 64,000 B/s; 5 s, data size 0
        (riff(fmt_chunk(3, 1, 16000, 32), chunk(b"data", b"\0" * 320_000, size=0)), 5.0),
        # WAVE_FORMAT_EXTENSIBLE, PCM sub-format, 48 kHz stereo 24-bit: 288,000 B/s; 2 s
        (
            riff(
                chunk(
                    b"fmt ",
                    struct.pack("<HHIIHH", 0xFFFE, 2, 48000, 288000, 6, 24)
                    + struct.pack("<HHI", 22, 24, 3)
                    + struct.pack("<H", 1)
                    + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71",
                ),
                chunk(b"data", b"\0" * 576_000, size=0),
            ),
            2.0,
        ),
        # RF64: the 32-bit sizes say 0xFFFFFFFF, the 64-bit ones are in ds64: 3 s present
        (
            riff(
                chunk(b"ds64", b"\0" * 28),
                fmt_chunk(),
                chunk(b"data", ONE_S * 3, size=0xFFFFFFFF),
                magic=b"RF64",
                size=0xFFFFFFFF,
            ),
            3.0,
        ),
        # big-endian RIFX, data size 0: 4 s
        (
            riff(
                fmt_chunk(order=">"),
                chunk(b"data", ONE_S * 4, size=0, order=">"),
                magic=b"RIFX",
                order=">",
            ),
            4.0,
        ),
        # honest: 2 s, a LIST chunk after it
        (riff(fmt_chunk(), chunk(b"data", ONE_S * 2), chunk(b"LIST", b"INFOxxxx")), 2.0),
    ],
    ids=[
        "data-size-0",
        "data-and-riff-size-0",
        "data-size-past-the-end",
        "a-second-data-chunk",
        "byte-rate-and-block-align-lie",
        "float32",
        "extensible-pcm",
        "rf64",
        "rifx",
        "honest-with-trailing-list",
    ],
)
def test_a_wav_lasts_what_its_bytes_hold(data: bytes, seconds: float) -> None:
    assert seconds_of(data) == pytest.approx(seconds)


def test_the_issue_wav_costs_its_600_seconds() -> None:
    # 600 s × 25 tokens/s = 15,000 tokens (the honest header's figure), not 1
    lying = riff(fmt_chunk(), chunk(b"data", ONE_S * 600, size=0))
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(lying).decode()}}
    part["input_audio"]["format"] = "wav"
    media = part_of(part)
    assert media == MediaPart("audio", seconds=600.0)
    assert DEFAULT.tokens(media) == 15_000


@pytest.mark.parametrize("label", ["mp3", "flac", "audio/mpeg"])
def test_a_wav_labelled_as_another_format_costs_its_length(label: str) -> None:
    # the decoder (FFmpeg) reads the bytes, not the label: 600 s of WAV play as 600 s
    wav = riff(fmt_chunk(), chunk(b"data", ONE_S * 600))
    data = base64.b64encode(wav).decode()
    media = part_of({"type": "input_audio", "input_audio": {"data": data, "format": label}})
    assert media == MediaPart("audio", seconds=600.0)
    assert DEFAULT.tokens(media) == 15_000
    url = f"data:{label if '/' in label else 'audio/' + label};base64,{data}"
    assert part_of({"type": "audio_url", "audio_url": {"url": url}}) == media


def test_mp3_bytes_are_of_unknown_length_whatever_the_label() -> None:
    mp3 = base64.b64encode(b"ID3\x04\x00" + b"\0" * 2000).decode()
    for label in ("mp3", "wav"):
        media = part_of({"type": "input_audio", "input_audio": {"data": mp3, "format": label}})
        assert media == MediaPart("audio", seconds=None)  # the default 750 tokens


def test_a_data_url_wav_with_a_zero_size_costs_its_length() -> None:
    lying = riff(fmt_chunk(), chunk(b"data", ONE_S * 40, size=0))
    url = "data:audio/wav;base64," + base64.b64encode(lying).decode()
    media = part_of({"type": "audio_url", "audio_url": {"url": url}})
    assert media is not None and DEFAULT.tokens(media) == 40 * 25


def test_a_compressed_wav_is_of_unknown_length() -> None:
    # IMA ADPCM (tag 0x11): no fixed sample width, the default 750 tokens
    data = riff(fmt_chunk(0x11, 1, 8000, 4), chunk(b"data", b"\0" * 4000))
    assert seconds_of(data) is None
    assert DEFAULT.tokens(MediaPart("audio", seconds=None)) == 750


def test_many_tiny_chunks_count_the_rest_as_audio_and_stay_cheap() -> None:
    # 64 chunks are walked (fmt + 63 empty ones); the bytes after them count as audio:
    # 10 s of samples + 7 more empty chunk headers (56 B) + the data header (8 B) at 8,000 B/s
    junk = chunk(b"junk", b"") * 70
    data = riff(fmt_chunk(), junk, chunk(b"data", ONE_S * 10))
    assert seconds_of(data) == pytest.approx(10 + 64 / 8000)
    # a body of nothing but empty chunks (~8 MB) is not walked 8 bytes at a time
    flood = riff(fmt_chunk(), chunk(b"junk", b"") * 1_000_000)
    t0 = time.perf_counter()
    seconds_of(flood)
    assert time.perf_counter() - t0 < 0.5


# -- images whose header cannot be trusted: the byte bound


def _model(tmp_path: Path, name: str, **files: dict[str, Any]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    for stem, content in files.items():
        (folder / f"{stem}.json").write_text(json.dumps(content), "utf-8")
    return str(folder)


def test_the_image_byte_bound_by_hand(tmp_path: Path) -> None:
    qwen = {"image_processor_type": "Qwen2VLImageProcessor"}
    # Qwen2.5-VL defaults: f = 14 × 2 = 28 px, max_pixels 1,003,520: 1,003,520 // 784 + 2 = 1,282
    q25 = media_cost(MediaSpec(model_dir=_model(tmp_path, "q25", preprocessor_config=qwen)))
    assert q25.image_byte_bound() == 1282
    # Qwen2-VL: max_pixels 12,845,056 // 784 + 2 = 16,386
    cfg = {"model_type": "qwen2_vl"}
    q2 = media_cost(
        MediaSpec(model_dir=_model(tmp_path, "q2", preprocessor_config=qwen, config=cfg))
    )
    assert q2.image_byte_bound() == 16386
    # LLaVA-1.5, CLIP 336/14: (336 // 14)² = 576; "full" keeps CLS: 577
    vision = {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}
    llava = {"model_type": "llava", "vision_config": vision}
    lv = media_cost(MediaSpec(model_dir=_model(tmp_path, "lv", config=llava)))
    assert lv.image_byte_bound() == 576
    full = {**llava, "vision_feature_select_strategy": "full"}
    lvf = media_cost(MediaSpec(model_dir=_model(tmp_path, "lvf", config=full)))
    assert lvf.image_byte_bound() == 577
    # the defaults: the profile's per-image figure
    assert DEFAULT.image_byte_bound() == 576
    assert media_cost(MediaSpec(tokens_per_image=999)).image_byte_bound() == 999


def test_an_image_in_a_format_ice_does_not_read_is_charged_its_byte_bound(tmp_path: Path) -> None:
    # a 2×2 BMP (vLLM opens BMP; ICE reads no BMP header): Qwen2.5-VL's bound, 1,282 tokens,
    # not a 2×2 image's 6 (the minimum, 56×56: 4 + 2)
    bmp = b"BM" + b"\0" * 64
    url = "data:image/bmp;base64," + base64.b64encode(bmp).decode()
    part = part_of({"type": "image_url", "image_url": {"url": url}})
    assert part == MediaPart("image")
    qwen = {"image_processor_type": "Qwen2VLImageProcessor"}
    cost = media_cost(MediaSpec(model_dir=_model(tmp_path, "q", preprocessor_config=qwen)))
    assert cost.tokens(part) == cost.image_byte_bound() == 1282
    assert cost.tokens(MediaPart("image", width=2, height=2)) == 6
