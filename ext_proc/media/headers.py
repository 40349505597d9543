"""Reading sizes from media bytes without decoding them: an image's width and height from its
header (PNG, JPEG, GIF through Pillow's format classes; WebP by hand), a WAV's duration
(``ext_proc.media``)."""

from __future__ import annotations

import base64
import binascii
import io
import urllib.parse
import warnings
import wave
from collections.abc import Iterator

__all__ = ["audio_seconds", "image_size"]

# Base64 characters decoded to read a header, tried in turn (multiples of 4: 3 and 48 KiB
# of data); the whole payload is decoded only when neither holds the header.
_PREFIX_B64_CHARS = (4 * 1024, 64 * 1024)
_WAV_FORMATS = frozenset({"wav", "wave", "x-wav", "vnd.wave"})


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
