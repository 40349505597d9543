"""What the per-request KV arithmetic costs the request path.

    .venv/bin/python bench/kv_arithmetic.py [--calls 200000]

For each model configuration in ``tests/data/kv`` (full attention, GQA, MLA, sliding-window
and hybrid layer groups), builds the geometry once and times ``request_blocks(input, output,
block_size)`` over ``--calls`` calls with varying input sizes; prints µs per call (mean of an
untimed loop, best of 5 repeats). The target in issue 4 is under 5 µs per call.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ext_proc.kv import build_geometry, shape_from_config

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kv"


def per_call_us(path: Path, calls: int) -> float:
    geometry = build_geometry(shape_from_config(json.loads(path.read_text())))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            geometry.request_blocks(i, 256, 64)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    for path in sorted(DATA.glob("*.json")):
        try:
            us = per_call_us(path, args.calls)
        except ValueError as exc:  # a configuration ICE refuses (e.g. Mamba hybrids)
            print(f"{path.stem:<32} refused: {exc}")
            continue
        print(f"{path.stem:<32} {us:6.3f} µs per request_blocks call")


if __name__ == "__main__":
    main()
