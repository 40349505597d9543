"""An image's width and height from its header bytes, read as Pillow's format classes read
them, in a bounded number of steps (``ext_proc.media``).

vLLM 0.32 opens images with Pillow (``vllm/multimodal/image.py``); the size it then works
with is the one these walks read (Pillow 13's ``PngImagePlugin``, ``JpegImagePlugin``,
``GifImagePlugin``; WebP: libwebp's canvas, from the first chunk):

- **PNG**: the ``IHDR`` chunk, which the format puts first (bytes 16–24). Pillow walks every
  chunk up to the first ``IDAT`` to collect metadata, one Python step per chunk; the size
  never comes from a later chunk, so ICE reads ``IHDR`` and stops.
- **JPEG**: the markers from the start of the file to the start of scan (``SOS``), as
  Pillow's loop reads them: a marker's segment is skipped by its length, bytes that are not
  ``0xFF`` are junk (skipped, ICE with one ``find``), ``FF FF`` pads, ``FF 00`` is skipped,
  any other unknown marker fails the file. The size is the *last* ``SOF`` segment's before
  ``SOS`` (each one Pillow meets overwrites it).
- **GIF**: the logical screen, then the blocks of the first frame as Pillow's ``_seek(0)``
  reads them (extensions and their sub-blocks skipped, junk bytes skipped one by one) up to
  the first image descriptor; the size is the screen grown to hold that frame (a frame
  grown past twice Pillow's ``MAX_IMAGE_PIXELS`` is refused, as Pillow refuses it).
- **WebP**: the first chunk (``VP8 ``, ``VP8L`` or ``VP8X``), RFC 9649 §2.5–2.7.

Bounds: a walk takes at most ``MAX_STEPS`` steps (a marker, a segment, a sub-block, a junk
byte each count one) over the bytes it is given; past them it gives up (``Aborted``), and so
it does when the header lies past the longest prefix the caller decodes. The caller then
charges the image its byte bound (``ext_proc.media.cost``): a size ICE did not read never
makes an image cheaper. A walk that runs off the end of a prefix raises ``Short`` (decode
more); one that runs off the end of the whole payload, or meets bytes Pillow refuses, gives
``None`` (vLLM cannot open it either).

Invariants: no function here allocates more than its input, reads past it, or loops more
than ``MAX_STEPS`` times; none raises anything but ``Short`` and ``Aborted``.
"""

from __future__ import annotations

import functools

__all__ = ["MAX_STEPS", "Aborted", "Short", "image_header_size", "sniff"]

MAX_STEPS = 1024


class Short(Exception):
    """The walk needs bytes past the decoded prefix."""


class Aborted(Exception):
    """The walk took ``MAX_STEPS`` steps without reaching the size: the byte bound applies."""


def sniff(data: bytes) -> str | None:
    """The image format by its magic bytes (the start of the file decides)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def image_header_size(data: bytes, fmt: str, whole: bool) -> tuple[int, int] | None:
    """(width, height) of ``data`` in ``fmt``; ``whole``: ``data`` is all of the payload.
    Raises ``Short`` (a prefix ended first) or ``Aborted`` (the step bound)."""
    if fmt == "PNG":
        return _png(data, whole)
    if fmt == "JPEG":
        return _jpeg(data, whole)
    if fmt == "GIF":
        return _gif(data, whole)
    return _webp(data, whole)


def _valid(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None


def _need(data: bytes, end: int, whole: bool) -> bool:
    """True when ``data`` holds ``end`` bytes; raise ``Short`` when a longer prefix may."""
    if end <= len(data):
        return True
    if whole:
        return False
    raise Short


def _png(data: bytes, whole: bool) -> tuple[int, int] | None:
    if not _need(data, 24, whole) or data[12:16] != b"IHDR":
        return None
    return _valid(int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"))


@functools.cache
def _jpeg_markers() -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """Pillow's marker table: (every marker it knows, those with a segment, the SOFs)."""
    from PIL.JpegImagePlugin import MARKER

    known = frozenset(MARKER)
    segment = frozenset(m for m, (_, _, handler) in MARKER.items() if handler is not None)
    sof = frozenset(m for m, (_, _, h) in MARKER.items() if h is not None and h.__name__ == "SOF")
    return known, segment, sof


def _jpeg(data: bytes, whole: bool) -> tuple[int, int] | None:
    known, segment, sof = _jpeg_markers()
    size: tuple[int, int] | None = None
    pos = 3  # Pillow reads FF D8 FF, then pairs that FF with the next byte
    for _ in range(MAX_STEPS):
        if not _need(data, pos + 1, whole):
            return size  # the file ends before its scan: Pillow keeps the last SOF's size
        marker = 0xFF00 | data[pos]
        pos += 1
        if marker in known:
            if marker in segment:
                if not _need(data, pos + 2, whole):
                    return None
                length = int.from_bytes(data[pos : pos + 2], "big")
                if marker in sof:
                    if length < 7 or not _need(data, pos + length, whole):
                        return None
                    size = _valid(
                        int.from_bytes(data[pos + 5 : pos + 7], "big"),
                        int.from_bytes(data[pos + 3 : pos + 5], "big"),
                    )
                pos += 2 + max(0, length - 2)
            if marker == 0xFFDA:  # start of scan: the size is final
                return size
            pos = _jpeg_next_ff(data, pos, whole)
            if pos < 0:
                return size
        elif marker == 0xFFFF:
            continue  # padding: this FF pairs with the next byte
        elif marker == 0xFF00:
            pos = _jpeg_next_ff(data, pos, whole)
            if pos < 0:
                return size
        else:
            return None  # Pillow: "no marker found"
    raise Aborted


def _jpeg_next_ff(data: bytes, pos: int, whole: bool) -> int:
    """Where the byte after the next ``FF`` at or after ``pos`` is (Pillow skips junk);
    -1 at the end of the whole payload."""
    found = data.find(b"\xff", pos)
    if found < 0:
        if whole:
            return -1
        raise Short
    return found + 1


def _gif(data: bytes, whole: bool) -> tuple[int, int] | None:
    if not _need(data, 13, whole):
        return None
    width, height = int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    flags = data[10]
    pos = 13 + ((3 << ((flags & 7) + 1)) if flags & 128 else 0)
    for _ in range(MAX_STEPS):
        if not _need(data, pos + 1, whole):
            return None  # no frame: Pillow refuses the file
        tag = data[pos]
        pos += 1
        if tag == 0x3B:  # ";": the end, and no frame
            return None
        if tag == 0x21:  # "!": an extension, its label, then sub-blocks up to a 0
            pos = _gif_skip_blocks(data, pos + 1, whole)
            if pos < 0:
                return None
        elif tag == 0x2C:  # ",": the first frame's descriptor
            if not _need(data, pos + 9, whole):
                return None
            x0, y0, w, h = (
                int.from_bytes(data[i : i + 2], "little") for i in range(pos, pos + 8, 2)
            )
            grown = max(width, x0 + w), max(height, y0 + h)
            if grown != (width, height) and _bomb(grown[0] * grown[1]):
                return None  # Pillow refuses the frame (DecompressionBombError)
            return _valid(*grown)
    raise Aborted


def _bomb(pixels: int) -> bool:
    """Pillow's decompression-bomb refusal of a GIF frame grown past the screen."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return limit is not None and pixels > 2 * limit


def _gif_skip_blocks(data: bytes, pos: int, whole: bool) -> int:
    """The position after the sub-blocks from ``pos`` (their 0 included); -1 at the end
    of the whole payload. Each sub-block is a step."""
    for _ in range(MAX_STEPS):
        if not _need(data, pos + 1, whole):
            return -1
        n = data[pos]
        pos += 1 + n
        if n == 0:
            return pos
    raise Aborted


def _webp(data: bytes, whole: bool) -> tuple[int, int] | None:
    if len(data) < 30 and not whole:
        raise Short
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
