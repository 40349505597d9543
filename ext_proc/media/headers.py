"""Reading sizes from media bytes without decoding them: an image's width and height from its
header (``ext_proc.media.walks``: PNG, JPEG, GIF and WebP, as Pillow reads them), a WAV's
duration (``ext_proc.media``), each from a bounded prefix of a ``data:`` URL or base64 text
(``PREFIX_B64_CHARS``) in a bounded number of steps.

A WAV's duration is what the decoder will play, not what its header claims. vLLM 0.32 decodes
audio with torchcodec (FFmpeg) first, then soundfile (libsndfile), then PyAV (FFmpeg)
(``vllm/multimodal/media/audio.py``, ``load_audio``). Measured here with PyAV 18.1
(libavformat 62.12) and soundfile (libsndfile 1.2.2) on PCM WAVs:

- a ``data`` chunk size of 0: FFmpeg plays every byte to the end (600 s of 600 s present);
  libsndfile reads 0 frames;
- a size past the end (a streaming writer's 0xFFFFFFFF too): both play what is present;
- a size inside the payload (an honest header, other chunks after it): both play that size;
  with a second ``data`` chunk after it FFmpeg plays the second one (1 s + 20 s → 20 s);
- a lying RIFF size, byte rate or block align: ignored by both (frames from rate, channels
  and bits per sample).

So, in seconds: ``data_bytes / (sample_rate × channels × ceil(bits_per_sample / 8))`` with
``data_bytes`` the largest ``data`` chunk, each read as ``min(size, bytes present after its
header)``, or every byte present when its size is 0 (after 64 chunks, the bytes left count
as one more); rate, channels and bits from the
``fmt`` chunk, for sample formats of fixed width (PCM, IEEE float, A-law, µ-law, and
``WAVE_FORMAT_EXTENSIBLE`` of those). ``RIFF``, ``RF64``/``BW64`` (their 32-bit sizes say
0xFFFFFFFF: the bytes present count) and big-endian ``RIFX`` are read by their magic bytes,
whatever format the part names (FFmpeg finds the format from the bytes). Compressed WAVs
(ADPCM, GSM, MP3 in WAV) and other formats are of unknown duration (``None``)."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Iterator
from typing import Literal

from ext_proc.media import walks

__all__ = ["audio_seconds", "image_size"]

# Base64 characters decoded to read a header, tried in turn (multiples of 4: 3 KiB, 48 KiB
# and 768 KiB of data); a header past the last is not read (the byte bound applies), so no
# part costs more than decoding 1 MiB of base64 (~1 ms) and a walk of MAX_STEPS steps.
PREFIX_B64_CHARS = (4 * 1024, 64 * 1024, 1024 * 1024)
# Characters of a percent-encoded (not base64) data: URL unquoted, at most.
_PREFIX_URL_CHARS = 64 * 1024
_RIFF_ORDER: dict[bytes, Literal["little", "big"]] = {
    b"RIFF": "little",
    b"RF64": "little",
    b"BW64": "little",
    b"RIFX": "big",
}
# Chunks walked at most; past them the rest of the payload counts as audio (a body of tiny
# chunks would otherwise cost a Python step per 8 bytes).
_MAX_CHUNKS = 64
# WAVE format tags of a fixed sample width: PCM, IEEE float, A-law, µ-law
_FIXED_WIDTH_TAGS = frozenset({1, 3, 6, 7})
_EXTENSIBLE = 0xFFFE


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


def _decodings(text: str, start: int = 0) -> Iterator[tuple[bytes, bool, bool]]:
    """The base64 in ``text[start:]``, decoded as growing prefixes (3 KiB, 48 KiB, 768 KiB),
    each with whether it is the whole payload and whether it is the last decoded; the caller
    stops at the first it can read. Decoding is the cost (~1 µs per KiB); nothing past the
    last prefix is decoded."""
    for chars in PREFIX_B64_CHARS:
        end = start + chars
        whole = end >= len(text)
        prefix = text[start:end]
        try:
            head: bytes | None = base64.b64decode(prefix)
        except (binascii.Error, ValueError):
            # line breaks or a cut in the padding: the prefix up to a multiple of 4 may decode
            head = _lenient(prefix) if not whole else None
        if head is not None:
            yield head, whole, whole or chars == PREFIX_B64_CHARS[-1]
        if whole:
            return


def _lenient(prefix: str) -> bytes | None:
    """A prefix with whitespace (MIME line breaks) or cut mid-quantum, decoded."""
    compact = "".join(prefix.split())
    try:
        return base64.b64decode(compact[: len(compact) // 4 * 4])
    except (binascii.Error, ValueError):
        return None


def image_size(url_or_b64: str, *, base64_data: bool = False) -> tuple[int, int] | None:
    """(width, height) from the header bytes of a data: URL, or of raw base64 when
    ``base64_data``: PNG, JPEG, WebP, GIF (the bytes decide, not the declared media type),
    read by ``ext_proc.media.walks`` in bounded steps from a bounded prefix.

    ``None`` for http(s) and other non-data URLs, unreadable data, other formats, and a
    header the bounds did not reach (each is charged the byte bound).
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
        end = start + _PREFIX_URL_CHARS
        raw = urllib.parse.unquote_to_bytes(url_or_b64[start:end])
        whole = end >= len(url_or_b64)
        return _first_size(iter([(raw, whole, True)]))
    except Exception:
        return None


def _first_size(decodings: Iterator[tuple[bytes, bool, bool]]) -> tuple[int, int] | None:
    """The size from the first decoding whose header reads; stops at an unknown format, at
    a header the walk rejects, and when the walk's step bound is reached."""
    for data, whole, _ in decodings:
        fmt = walks.sniff(data)
        if fmt is None:
            return None  # the magic bytes are at the start: more data will not help
        try:
            return walks.image_header_size(data, fmt, whole)
        except walks.Short:
            continue
        except walks.Aborted:
            return None
    return None


def audio_seconds(data_b64: str, fmt: str) -> float | None:
    """Duration of base64 audio that is a WAV of a fixed sample width, from the bytes
    present (see the module docstring); ``None`` for other formats (mp3, …), compressed WAVs
    and unreadable data.

    ``fmt`` is the part's format (``wav``, or a media type such as ``audio/wav``); a WAV is
    read whatever it says: FFmpeg, vLLM's decoder, finds the format from the bytes, so a
    WAV labelled ``mp3`` plays as a WAV."""
    return _audio_seconds(data_b64, 0, fmt)


def _audio_seconds(text: str, start: int, fmt: str) -> float | None:
    try:  # ``fmt`` is not trusted: the decoder reads the bytes, whatever the label says
        estimate = (len(text) - start) * 3 // 4 - _padding(text)
        for data, whole, last in _decodings(text, start):
            if data[:4] not in _RIFF_ORDER or data[8:12] != b"WAVE":
                return None  # the magic bytes are at the start: more data will not help
            try:
                return _wav_seconds(data, len(data) if whole else estimate, last)
            except walks.Short:
                continue  # a chunk lies past this prefix: decode more
    except Exception:
        return None
    return None


def _wav_seconds(data: bytes, present: int, last: bool = True) -> float | None:
    """Seconds of the WAV whose first bytes are ``data`` and whose payload is ``present``
    bytes: its chunks walked from the first, each ``data`` chunk read as the module docstring
    says. Raises ``walks.Short`` when a chunk header lies past ``data`` and a longer prefix
    is decoded next; past the longest one (``data`` is the last prefix), the bytes from that
    chunk on count as audio, as after ``_MAX_CHUNKS`` chunks."""
    order = _RIFF_ORDER[data[:4]]
    frame_bytes = rate = 0
    longest: int | None = None
    pos = 12
    for _ in range(_MAX_CHUNKS):
        if pos + 8 > present:
            break
        if pos + 8 > len(data):
            if last:
                longest = max(longest or 0, present - pos)  # past the prefix: it may play
                break
            raise walks.Short
        tag, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], order)
        body = pos + 8
        if tag == b"fmt ":
            if body + 16 > len(data):
                if last:
                    break
                raise walks.Short
            rate, frame_bytes = _wav_format(data[body : body + min(size, 40)], order)
        elif tag == b"data":
            after = present - body
            played = size if 0 < size <= after else after
            longest = max(longest or 0, played)
            if played == after:
                break  # it runs to the end
        pos = body + size + (size & 1)  # chunks are padded to an even length
    else:
        longest = max(longest or 0, present - pos)  # too many chunks: the rest may play
    if longest is None or rate <= 0 or frame_bytes <= 0:
        return None
    return longest // frame_bytes / rate


def _wav_format(fmt: bytes, order: Literal["little", "big"]) -> tuple[int, int]:
    """(sample rate, bytes per frame) of a ``fmt`` chunk; (0, 0) for a format whose sample
    width is not fixed (compressed) or that is not stated."""
    tag = int.from_bytes(fmt[0:2], order)
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = int.from_bytes(fmt[24:26], order)  # the sub-format GUID's first two bytes
    channels = int.from_bytes(fmt[2:4], order)
    rate = int.from_bytes(fmt[4:8], order)
    bits = int.from_bytes(fmt[14:16], order)
    if tag not in _FIXED_WIDTH_TAGS:
        return 0, 0
    return rate, channels * -(-bits // 8)


def _padding(text: str) -> int:
    return 2 if text.endswith("==") else 1 if text.endswith("=") else 0
