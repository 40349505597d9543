"""Media headers are read in bounded bytes and steps (issue 30, case 2), with the size Pillow
reads: a header past the bounds is charged the byte bound, never less."""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib

import pytest
from PIL import Image

from ext_proc.media import MediaCost, image_size, part_of
from ext_proc.media import headers as media_headers
from ext_proc.media.headers import PREFIX_B64_CHARS, audio_seconds
from ext_proc.media.spec import MediaSpec
from ext_proc.media.walks import MAX_STEPS


def _url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _saved(fmt: str, size: tuple[int, int] = (2, 2), **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB" if fmt != "GIF" else "P", size).save(buf, fmt, **kw)
    return buf.getvalue()


def padded_png(chunks: int) -> bytes:
    """A 2×2 PNG with ``chunks`` empty tEXt chunks after its IHDR (12 bytes each)."""
    data = _saved("PNG")
    empty = struct.pack(">I", 0) + b"tEXt" + struct.pack(">I", zlib.crc32(b"tEXt"))
    return data[:33] + empty * chunks + data[33:]


def jpeg_with(segments: bytes, size: tuple[int, int] = (2, 2)) -> bytes:
    data = _saved("JPEG", size)
    return data[:2] + segments + data[2:]


def gif_with_comment_blocks(blocks: int, size: tuple[int, int] = (2, 2)) -> bytes:
    data = _saved("GIF", size)
    flags = data[10]
    at = 13 + ((3 << ((flags & 7) + 1)) if flags & 128 else 0)
    return data[:at] + b"\x21\xfe" + b"\x01a" * blocks + b"\x00" + data[at:]


def pillow_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def test_a_png_padded_with_400000_empty_chunks_is_sized_from_its_ihdr_without_walking_them() -> (
    None
):
    small = padded_png(50)
    assert image_size(_url(small)) == pillow_size(small) == (2, 2)
    decoded: list[int] = []
    real = base64.b64decode

    def counting(text: str | bytes) -> bytes:
        decoded.append(len(text))
        return real(text)

    big = _url(padded_png(400_000))
    assert len(big) > 6_000_000
    media_headers.base64.b64decode = counting  # type: ignore[assignment]
    try:
        assert image_size(big) == (2, 2)
    finally:
        media_headers.base64.b64decode = real  # type: ignore[assignment]
    assert decoded == [PREFIX_B64_CHARS[0]]  # 4 KiB of base64, not 6.4 MB


JPEG_CASES = {
    "plain": _saved("JPEG", (37, 23)),
    "progressive": _saved("JPEG", (40, 30), progressive=True),
    "exif_icc": _saved("JPEG", (64, 48), exif=b"Exif\0\0" + b"\0" * 40, icc_profile=b"\0" * 3000),
    "comments": jpeg_with(b"\xff\xfe\x00\x05abc" * 100, (9, 7)),
    "fill_bytes": jpeg_with(b"\xff\xff\xff\xfe\x00\x02", (5, 3)),
}


@pytest.mark.parametrize("name", sorted(JPEG_CASES))
def test_the_jpeg_walk_reads_the_size_pillow_reads(name: str) -> None:
    data = JPEG_CASES[name]
    assert image_size(_url(data, "image/jpeg")) == pillow_size(data)


def test_a_jpeg_with_two_frames_headers_is_sized_by_the_last_as_pillow_does() -> None:
    data = _saved("JPEG", (16, 8))
    sof = data.find(b"\xff\xc0")
    length = int.from_bytes(data[sof + 2 : sof + 4], "big")
    first = bytearray(data[sof : sof + 2 + length])
    first[5:9] = struct.pack(">HH", 4000, 3000)  # height, width of an earlier SOF
    data = data[:sof] + bytes(first) + data[sof:]
    assert image_size(_url(data, "image/jpeg")) == pillow_size(data) == (16, 8)


def test_a_jpeg_of_more_segments_than_the_walk_takes_is_charged_its_byte_bound() -> None:
    data = jpeg_with(b"\xff\xfe\x00\x02" * (MAX_STEPS + 10))
    assert pillow_size(data) == (2, 2)  # Pillow walks them all, one Python step each
    url = _url(data, "image/jpeg")
    assert image_size(url) is None
    part = part_of({"type": "image_url", "image_url": {"url": url}})
    assert part is not None and (part.width, part.height) == (None, None)
    cost = MediaCost(MediaSpec(tokens_per_image=900))
    assert cost.tokens(part) == cost.image_byte_bound() == 900


def test_a_gif_is_sized_as_pillow_does_and_a_walk_past_the_bound_is_the_byte_bound() -> None:
    data = gif_with_comment_blocks(100, (7, 5))
    assert image_size(_url(data, "image/gif")) == pillow_size(data) == (7, 5)
    assert image_size(_url(gif_with_comment_blocks(MAX_STEPS + 1), "image/gif")) is None


def test_a_header_past_the_longest_decoded_prefix_is_not_read() -> None:
    app = b"\xff\xe1\xff\xff" + b"\0" * 0xFFFD  # 64 KiB APP1 segments
    data = jpeg_with(app * 14)  # the SOF lies past 768 KiB of data
    assert data.find(b"\xff\xc0") > PREFIX_B64_CHARS[-1] * 3 // 4
    assert pillow_size(data) == (2, 2)
    assert image_size(_url(data, "image/jpeg")) is None  # the byte bound applies


def test_a_percent_encoded_data_url_is_read_from_its_prefix() -> None:
    data = padded_png(0) + b"\0" * 3_000_000
    url = "data:image/png," + "".join(f"%{b:02x}" for b in data)
    assert image_size(url) == (2, 2)


def _wav_with_junk(seconds: int, junk: int, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(b"\x80" * rate * seconds)
    data = buf.getvalue()
    data_at = data.find(b"data")
    return data[:data_at] + b"JUNK" + struct.pack("<I", junk) + b"\0" * junk + data[data_at:]


def test_a_wav_chunk_past_the_longest_prefix_counts_every_byte_from_there_as_audio() -> None:
    near = _wav_with_junk(3, 1000)
    assert audio_seconds(base64.b64encode(near).decode(), "wav") == 3.0
    far = _wav_with_junk(3, 900_000)  # the data chunk's header lies past 768 KiB
    seconds = audio_seconds(base64.b64encode(far).decode(), "wav")
    # 8,000 one-byte frames a second; the walk stops at the chunk header at 36 + 8 +
    # 900,000 = 900,044, and the 924,052 − 900,044 = 24,008 bytes from there count as audio
    assert seconds == 24_008 / 8000
