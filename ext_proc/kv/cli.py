"""``ice plan``: how many KV blocks, tokens and concurrent requests a vLLM rank will have.

Usage (``python -m ext_proc.kv.cli`` or, once wired, ``ice plan``)::

    ice plan --config config.json --kv-memory 3.81GiB --max-model-len 20000
    ice plan --layers 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 \\
             --gpu-memory 80GiB --gpu-memory-utilization 0.9 --non-kv-memory 17GiB \\
             --max-model-len 32768 --avg-seq-len 3000 --json

Inputs: the model as ``--config`` (a Hugging Face config.json) or ``--layers``, ``--kv-heads``,
``--head-dim`` (+ ``--attention-heads``, ``--sliding-window``, ``--dtype``); serving options
``--kv-dtype`` (auto), ``--block-size`` (16), ``--tp`` (1), ``--max-num-batched-tokens``
(8192), ``--in-flight-batches`` (1; 2 matches vLLM 0.32's async scheduling),
``--disable-hybrid-kv-cache-manager``, ``--data-parallel-size`` (1; the ranks behind one vLLM
API server, for the valve); memory per rank as ``--kv-memory`` or ``--gpu-memory`` +
``--gpu-memory-utilization`` + ``--non-kv-memory`` (sizes: ``ext_proc.kv.units``), or
``--num-gpu-blocks-override``; ``--max-model-len`` (default: derived from config.json),
``--avg-seq-len``, ``--lengths FILE`` (one length per line, ``#`` comments).

Output: a table, or with ``--json`` one object (keys listed in ``plan_to_dict``), ending with
the recommended vLLM admission valve behind ICE (``--max-num-queued-reqs``,
``--max-num-queued-tokens``; a figure the inputs do not allow is left out with its reason, null
in ``--json``). Formulas: ``ext_proc.kv.geometry``, ``ext_proc.kv.capacity``,
``ext_proc.kv.valve``.

Exit status: 0; 2 for a missing, malformed or contradictory input, an unreadable file, or a
model whose cache is not modelled — with one line ``ice plan: <field>: <why>`` on stderr.

Invariant: imports only the standard library and ``ext_proc.kv`` (the whole command answers
in well under 300 ms, process start included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from ext_proc.kv.capacity import CapacityPlan, available_kv_bytes, plan_capacity
from ext_proc.kv.errors import KVInputError
from ext_proc.kv.geometry import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    build_geometry,
)
from ext_proc.kv.hfconfig import ModelShape, shape_from_config, shape_from_numbers
from ext_proc.kv.units import format_gib, parse_size
from ext_proc.kv.valve import REQS_FACTOR, ValveAdvice, valve_advice

__all__ = ["build_parser", "main", "plan_to_dict", "render_table"]

_NUMBER_OPTIONS = ("layers", "kv_heads", "head_dim", "attention_heads", "sliding_window")


def build_parser() -> argparse.ArgumentParser:
    """The ``plan`` argument parser (also usable as an ``ice`` subcommand's parser)."""
    ap = argparse.ArgumentParser(
        prog="ice plan",
        description="KV-cache blocks, tokens and concurrency of one vLLM rank",
    )
    m = ap.add_argument_group("model (--config, or the numbers)")
    m.add_argument("--config", help="a Hugging Face config.json")
    m.add_argument("--layers", type=int, help="attention layers")
    m.add_argument("--kv-heads", type=int, help="KV heads of the whole model")
    m.add_argument("--head-dim", type=int, help="elements per head")
    m.add_argument("--attention-heads", type=int, help="query heads (default: --kv-heads)")
    m.add_argument("--sliding-window", type=int, help="every layer slides over this many tokens")
    m.add_argument("--dtype", help="model dtype (vLLM --dtype; default: config.json's)")
    s = ap.add_argument_group("serving")
    s.add_argument("--kv-dtype", default="auto", help="auto, bfloat16, float16, float32, fp8, …")
    s.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    s.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    s.add_argument("--max-model-len", type=int, help="default: derived from config.json")
    s.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    s.add_argument("--in-flight-batches", type=int, default=1, help="2 for vLLM 0.32 async")
    s.add_argument("--disable-hybrid-kv-cache-manager", action="store_true")
    s.add_argument("--num-gpu-blocks-override", type=int)
    s.add_argument(
        "--data-parallel-size",
        "--dp",
        type=int,
        default=1,
        help="ranks behind one vLLM API server (its valve counts them all)",
    )
    mem = ap.add_argument_group("memory per rank (--kv-memory, or the three --gpu/--non-kv)")
    mem.add_argument("--kv-memory", help="bytes for the KV cache, e.g. 3.81GiB")
    mem.add_argument("--gpu-memory", help="GPU memory, e.g. 80GiB")
    mem.add_argument("--gpu-memory-utilization", help="fraction vLLM may use, e.g. 0.9")
    mem.add_argument("--non-kv-memory", help="weights + activations + graphs, e.g. 17GiB")
    w = ap.add_argument_group("workload")
    w.add_argument("--avg-seq-len", type=int, help="tokens (prompt + output) per sequence")
    w.add_argument("--lengths", help="file with one sequence length per line")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def _size(text: str | None, field: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise KVInputError(field, str(e)) from None


def _read_lengths(path: str) -> list[int]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise KVInputError("lengths", f"cannot read {path}: {e.strerror or e}") from None
    out: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not text.isdigit():
            raise KVInputError("lengths", f"{path}:{number}: not a length: {text!r}")
        out.append(int(text))
    return out


def _shape(args: argparse.Namespace) -> ModelShape:
    numbers = {k: getattr(args, k) for k in _NUMBER_OPTIONS if getattr(args, k) is not None}
    if args.config is not None:
        if numbers:
            field = next(iter(numbers))
            raise KVInputError(field, "cannot be combined with --config")
        try:
            with open(args.config, encoding="utf-8") as f:
                config = json.load(f)
        except OSError as e:
            raise KVInputError("config", f"cannot read {args.config}: {e.strerror or e}") from None
        except ValueError as e:
            raise KVInputError("config", f"{args.config} is not JSON: {e}") from None
        shape = shape_from_config(config)
        if args.dtype is not None:
            shape = dataclasses.replace(shape, model_dtype=args.dtype)
        return shape
    for field in ("layers", "kv_heads", "head_dim"):
        if field not in numbers:
            raise KVInputError(field, "missing (give --config, or --layers --kv-heads --head-dim)")
    return shape_from_numbers(
        layers=args.layers,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        attention_heads=args.attention_heads,
        dtype=args.dtype,
        sliding_window=args.sliding_window,
    )


def _plan(args: argparse.Namespace) -> tuple[CapacityPlan, str]:
    """The plan, and where its max_model_len came from (for the table)."""
    shape = _shape(args)
    geometry = build_geometry(
        shape,
        tp=args.tp,
        kv_dtype=args.kv_dtype,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        in_flight_batches=args.in_flight_batches,
        hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
    )
    given = args.max_model_len is not None
    max_model_len = args.max_model_len if given else shape.max_model_len
    memory = (args.kv_memory, args.gpu_memory, args.gpu_memory_utilization, args.non_kv_memory)
    available = None
    if any(v is not None for v in memory) or args.num_gpu_blocks_override is None:
        available = available_kv_bytes(
            kv_memory=_size(args.kv_memory, "kv_memory"),
            gpu_memory=_size(args.gpu_memory, "gpu_memory"),
            gpu_memory_utilization=args.gpu_memory_utilization,
            non_kv_memory=_size(args.non_kv_memory, "non_kv_memory"),
        )
    lengths = _read_lengths(args.lengths) if args.lengths is not None else None
    note = "" if given else f" (config.json: {shape.max_model_len_source})"
    if max_model_len is None:
        note = ""
    plan = plan_capacity(
        geometry,
        max_model_len=max_model_len,
        available_bytes=available,
        num_blocks_override=args.num_gpu_blocks_override,
        avg_seq_len=args.avg_seq_len,
        lengths=lengths,
    )
    return plan, note


def plan_to_dict(plan: CapacityPlan, valve: ValveAdvice | None = None) -> dict[str, Any]:
    """The ``--json`` object: every capacity figure, the geometry it came from, and ``valve``
    (``valve_advice(plan)`` unless given; a figure it cannot give is null)."""
    g = plan.geometry
    v = valve_advice(plan) if valve is None else valve
    return {
        "bytes_per_token": g.bytes_per_token,
        "bytes_per_block": g.bytes_per_block,
        "page_bytes_per_layer": g.page_bytes,
        "available_kv_bytes": plan.available_kv_bytes,
        "num_blocks_from_memory": plan.num_blocks_from_memory,
        "num_blocks": plan.num_blocks,
        "kv_cache_tokens": plan.kv_cache_tokens,
        "token_slots": plan.token_slots,
        "max_model_len": plan.max_model_len,
        "blocks_per_request": plan.blocks_per_request,
        "max_concurrency": plan.max_concurrency,
        "max_concurrency_printed": (
            None if plan.max_concurrency is None else f"{plan.max_concurrency:.2f}x"
        ),
        "bytes_needed_for_max_model_len": plan.bytes_needed_for_max_model_len,
        "fits_max_model_len": plan.fits_max_model_len,
        "estimated_max_model_len": plan.estimated_max_model_len,
        "avg_seq_len": plan.avg_seq_len,
        "max_num_seqs_safe": plan.max_num_seqs_safe,
        "fragmentation": plan.fragmentation,
        "valve": {
            "max_num_queued_reqs": v.max_num_queued_reqs,
            "max_num_queued_tokens": v.max_num_queued_tokens,
        },
        "geometry": {
            "attention": g.attention,
            "num_layers": g.num_layers,
            "kv_heads": g.kv_heads,
            "kv_heads_per_rank": g.kv_heads_per_rank,
            "head_dim": g.head_dim,
            "kv_dtype": g.kv_dtype,
            "kv_dtype_bytes": g.kv_dtype_bytes,
            "tp": g.tp,
            "block_size": g.block_size,
            "groups": [
                {"sliding_window": grp.sliding_window, "num_layers": grp.num_layers}
                for grp in g.groups
            ],
        },
    }


def _opt(value: object, fmt: str = "{:,}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _context_rows(plan: CapacityPlan, note: str) -> list[tuple[str, str]]:
    """The rows that need max_model_len, or the one line that says they are left out."""
    if (
        plan.max_model_len is None
        or plan.max_concurrency is None
        or plan.blocks_per_request is None
        or plan.bytes_needed_for_max_model_len is None
    ):
        return [
            (
                "max_model_len",
                "not given: max concurrency and the memory one full-length request needs "
                "are left out (give --max-model-len or --config)",
            )
        ]
    return [
        ("max_model_len", f"{plan.max_model_len:,}{note}"),
        (
            "max concurrency",
            f"{plan.max_concurrency:.2f}x ({plan.blocks_per_request:,} blocks per request)",
        ),
        (
            "memory for one max_model_len",
            f"{plan.bytes_needed_for_max_model_len:,} B "
            f"({'fits' if plan.fits_max_model_len else 'does NOT fit'})",
        ),
    ]


def _valve_rows(v: ValveAdvice) -> list[tuple[str, str]]:
    """The valve's flags (those the inputs allow) and one line on why these values."""
    flags = []
    if v.max_num_queued_reqs is not None:
        flags.append(f"--max-num-queued-reqs {v.max_num_queued_reqs}")
    if v.max_num_queued_tokens is not None:
        flags.append(f"--max-num-queued-tokens {v.max_num_queued_tokens}")
    ranks = f"{v.data_parallel_size} ranks × " if v.data_parallel_size > 1 else ""
    if v.safe_sequences is not None:
        reqs = (
            f"{REQS_FACTOR} × {ranks}{v.safe_sequences} safe sequences"
            " (a full batch running, one waiting)"
        )
    else:
        reqs = f"reqs left out ({v.reqs_left_out})"
    if v.tokens_per_rank is not None:
        tokens = f"{ranks}one full cache of prompts ({v.tokens_per_rank:,} tokens)"
    else:
        tokens = f"tokens left out ({v.tokens_left_out})"
    rule = f"{reqs}; {tokens}"
    if not flags and v.reqs_left_out == v.tokens_left_out:
        rule = f"left out ({v.reqs_left_out})"
    return [("vLLM valve (behind ICE)", " ".join(flags) or "n/a"), ("valve rule", rule)]


def render_table(
    plan: CapacityPlan, max_model_len_note: str = "", valve: ValveAdvice | None = None
) -> str:
    """The human-readable form of ``plan``, ending with ``valve`` (``valve_advice(plan)``
    unless given)."""
    g = plan.geometry
    full = sum(grp.num_layers for grp in g.groups if grp.sliding_window is None)
    sliding = sorted({grp.sliding_window for grp in g.groups if grp.sliding_window})
    layers = f"{g.num_layers} layers"
    if sliding:
        layers += f" ({full} full, {g.num_layers - full} sliding W={'/'.join(map(str, sliding))})"
    avail = plan.available_kv_bytes
    est = plan.estimated_max_model_len
    rows = [
        ("model", f"{g.attention}, {layers}, head_dim {g.head_dim}"),
        ("KV heads", f"{g.kv_heads_per_rank} per rank ({g.kv_heads} total, tp={g.tp})"),
        ("KV dtype", f"{g.kv_dtype} ({g.kv_dtype_bytes} B)"),
        ("bytes per token", f"{g.bytes_per_token:,}"),
        (
            "block",
            f"{g.block_size} tokens, {g.bytes_per_block:,} B in the pool "
            f"({len(g.groups)} group{'s' if len(g.groups) > 1 else ''}, "
            f"{g.page_bytes:,} B per layer)",
        ),
        (
            "available KV memory",
            "n/a" if avail is None else f"{avail:,} B ({format_gib(avail)} GiB)",
        ),
        ("blocks", f"{plan.num_blocks:,}"),
        (
            "KV cache size",
            f"{_opt(plan.kv_cache_tokens)} tokens ({plan.token_slots:,} token slots)",
        ),
        *_context_rows(plan, max_model_len_note),
        ("longest request that fits", "unbounded (sliding window)" if est is None else f"{est:,}"),
        ("avg sequence", _opt(plan.avg_seq_len)),
        ("safe max_num_seqs", _opt(plan.max_num_seqs_safe)),
        ("fragmentation", _opt(plan.fragmentation, "{:.2%}")),
        *_valve_rows(valve_advice(plan) if valve is None else valve),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ice plan``; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else 2
    try:
        plan, note = _plan(args)
        valve = valve_advice(plan, data_parallel_size=args.data_parallel_size)
    except KVInputError as e:
        print(f"ice plan: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_to_dict(plan, valve), indent=2))
    else:
        print(render_table(plan, note, valve))
    return 0


if __name__ == "__main__":
    sys.exit(main())
