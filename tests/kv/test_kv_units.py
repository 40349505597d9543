"""Size strings → exact bytes (ext_proc.kv.units)."""

from __future__ import annotations

import pytest

from ext_proc.kv import format_gib, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1024", 1024),
        ("1024B", 1024),
        ("1.9", 1),  # plain bytes: floor
        ("1KiB", 1024),
        ("1KB", 1000),
        ("2MiB", 2 * 2**20),
        ("2MB", 2_000_000),
        ("80GiB", 80 * 2**30),
        ("80GB", 80 * 10**9),
        ("1TiB", 2**40),
        ("1TB", 10**12),
        ("3.81GiB", 4_090_956_349),  # floor(381 × 2^30 / 100) = floor(4090956349.44)
        ("0.5GiB", 2**29),
        ("17.5GB", 17_500_000_000),
        ("1.0000000001GiB", 2**30 + 0),  # 2^30 × 1e-10 = 0.107 → floored away
        (" 16 GiB ", 16 * 2**30),
        ("16gib", 16 * 2**30),  # units are case-insensitive
        ("64 mb", 64_000_000),
    ],
    ids=[
        "zero",
        "bytes",
        "bytes-suffix",
        "bytes-decimal",
        "kib",
        "kb",
        "mib",
        "mb",
        "gib",
        "gb",
        "tib",
        "tb",
        "decimal-gib",
        "half-gib",
        "decimal-gb",
        "tiny-fraction",
        "spaces",
        "lower-case",
        "lower-mb-space",
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "GiB", "-1GiB", "1e9", "1,5GiB", "3.81 GiBs", "1.GiB", ".5GiB", "12 Gb/s", "1 gigabyte"],
    ids=[
        "empty",
        "unit-only",
        "negative",
        "exponent",
        "comma",
        "bad-unit",
        "dot-no-frac",
        "no-int",
        "rate",
        "word",
    ],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("n_bytes", "printed"),
    [(4_093_640_704, "3.81"), (4_095_737_855, "3.81"), (3_099_590_656, "2.89"), (2**30, "1.00")],
    ids=["1952-blocks-low", "1952-blocks-high", "1478-blocks-low", "one-gib"],
)
def test_format_gib_matches_vllm_two_decimals(n_bytes: int, printed: str) -> None:
    assert format_gib(n_bytes) == printed
