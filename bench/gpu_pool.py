"""The overload bench on a GPU-shaped pool: real vLLM scheduler, modelled compute.

``vllm serve`` runs vLLM's own API server, scheduler, KV cache manager, preemption and
``/metrics`` at a real model's geometry (``--model``, default Llama-3.1-8B on one H100 SXM)
with ``ext_proc.lab.gpupool``'s executor in place of the model: each engine step sleeps k ×
its modelled GPU time (``--dilation`` k; docs/gpu-pool.md). The KV pool is ICE's arithmetic
for that GPU (``ice plan``) unless ``--kv-memory`` gives a smaller budget (to keep the number
of concurrent streams within what 2 cores can drive).

Workloads (``--workload``; ``ext_proc/lab/gpupool/workloads.py``): chat, retrieval,
reasoning, mix; ``--requests`` per run, Poisson arrivals at ``--load`` × the pool's sustainable
rate (the timing model's estimate for the plan's mean sizes), one plan per ``--seeds`` seed;
``--limits exact`` (max_tokens = the drawn length, ignore_eos) or ``client`` (1024 or none,
the drawn length reached by min_tokens + an EOS bias).

Arms (``--arms``, comma-separated): ``direct`` (straight to vLLM), ``reserve``, ``forecast``
and ``slo`` (through Envoy + ICE with that admission, ``dilate.gpu_policy``; slo's TTFT target
is ``--ttft-slo-s`` × k), ``slo-queue`` (slo with its admission queue on: a request waits by
deadline, at most until its target has passed), ``queue``
(ICE reserve with its admission queue on), ``valve:reqs=N`` / ``valve:tokens=T`` (vLLM's own
admission valve; the best setting per workload is an oracle: it was chosen after the fact).
Each arm group (the vLLM it needs, the ICE policy) gets its own stack, one after another; the
runs are ``ext_proc.lab.overload``'s (``compare``, ``RunResult``), scored the same way.

Time: arrivals, the TTFT SLO (``--ttft-slo-s``, modelled) and ICE's time settings are × k.
Reported figures are in modelled time: TTFT and TPOT = wall / k; goodput (tokens of the 200s
whose TTFT met the SLO / drain time) and throughput = wall × k.

    .venv/bin/python bench/gpu_pool.py --workload chat --load 1.5 --seeds 1,2 --dilation 10 \\
        --kv-memory 1GiB --max-model-len 8192 --requests 60 \\
        --arms direct,reserve,forecast,valve:reqs=16
    .venv/bin/python bench/gpu_pool.py --dry-run --workload mix
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ext_proc.kv import parse_size
from ext_proc.lab.gpupool import MODELS, PoolSpec, serve_config
from ext_proc.lab.gpupool.dilate import gpu_policy, wall_plan
from ext_proc.lab.gpupool.workloads import KINDS, plan_gpu, sustainable_rate
from ext_proc.lab.overload import RunResult, compare, overload_setup
from ext_proc.lab.overload.arms import Valve
from ext_proc.lab.overload.burst import Planned
from ext_proc.lab.overload.setup import QUEUE_WAIT_MS

ARMS = ("direct", "reserve", "forecast", "slo", "slo-queue", "queue")


def _groups(arms: Sequence[str]) -> list[tuple[str, Valve | None, list[str]]]:
    """(ICE admission, valve, modes) per stack: reserve's stack also runs direct and queue."""
    out: list[tuple[str, Valve | None, list[str]]] = []
    first = [m for m in ("direct", "reserve", "queue") if m in arms]
    if first:
        out.append(("reserve", None, first))
    for admission in ("forecast", "slo"):
        if admission in arms:
            out.append((admission, None, [admission]))
    if "slo-queue" in arms:
        out.append(("slo", None, ["slo-queue"]))
    for arm in arms:
        if arm.startswith("valve:"):
            out.append(("reserve", Valve.parse(arm.removeprefix("valve:")), [arm]))
        elif arm not in ARMS:
            raise SystemExit(f"bad arm {arm!r}: want {', '.join(ARMS)} or valve:reqs=N|tokens=T")
    return out


def _mode(arm: str) -> str:
    return {
        "reserve": "ice",
        "forecast": "ice",
        "slo": "ice",
        "queue": "queue",
        "slo-queue": "queue",
    }.get(arm, "direct")


def _tpot_s(result: RunResult) -> list[float]:
    return [
        (s.latency_s - s.ttft_s) / (s.completion_tokens - 1)
        for s in result.shots
        if s.status == 200 and s.ttft_s is not None and s.completion_tokens > 1
    ]


def _q(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def _row(arm: str, seed: int, result: RunResult, k: float) -> dict[str, Any]:
    s = result.summary()
    waits = [x.ttft_s / k for x in result.shots if x.status == 200 and x.ttft_s is not None]
    tpot = [t / k for t in _tpot_s(result)]
    return {
        "arm": arm,
        "seed": seed,
        "requests": s["requests"],
        "completed": s["ok"],
        "slo_met": s["slo_met"],
        "slo_attainment": round(s["slo_met"] / s["requests"], 3),
        "goodput_tok_s": round(s["goodput_tok_per_s"] * k, 1),
        "throughput_tok_s": round(s["output_tok_per_s"] * k, 1),
        "preemptions": s["preemptions"],
        "ttft_p50_s": _q(waits, 0.5),
        "ttft_p95_s": _q(waits, 0.95),
        "tpot_p50_ms": None if not tpot else round(1000 * (_q(tpot, 0.5) or 0.0), 2),
        "tpot_p95_ms": None if not tpot else round(1000 * (_q(tpot, 0.95) or 0.0), 2),
        "shed_429": s["shed_429"],
        "refused_503": s["refused_503"],
        "kv_usage_max": s["kv_usage_max"],
        "forecast_peak_max": s["forecast_peak_max"],
        "running_max": s["running_max"],
        "waiting_max": s["waiting_max"],
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def _table(rows: Sequence[dict[str, Any]]) -> str:
    cols = [
        "arm", "seed", "completed", "slo_attainment", "goodput_tok_s", "throughput_tok_s",
        "preemptions", "ttft_p50_s", "ttft_p95_s", "tpot_p50_ms", "tpot_p95_ms", "shed_429",
        "refused_503", "kv_usage_max", "forecast_peak_max", "running_max",
    ]  # fmt: skip
    lines = ["\t".join(cols)]
    lines += ["\t".join(_fmt(r[c]) for c in cols) for r in rows]
    arms = dict.fromkeys(r["arm"] for r in rows)
    lines.append("")
    lines.append("arm\tgoodput median [min–max]\tvs direct (per seed)")
    direct = {r["seed"]: r["goodput_tok_s"] for r in rows if r["arm"] == "direct"}
    for arm in arms:
        g = [r["goodput_tok_s"] for r in rows if r["arm"] == arm]
        ratios = [
            r["goodput_tok_s"] / direct[r["seed"]]
            for r in rows
            if r["arm"] == arm and direct.get(r["seed"])
        ]
        ratio = " ".join(f"{x:.2f}" for x in ratios) or "-"
        lines.append(f"{arm}\t{statistics.median(g):.1f} [{min(g):.1f}–{max(g):.1f}]\t{ratio}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=tuple(MODELS), default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=None, help="default: the model's (8B: 1, 70B: 4)")
    ap.add_argument("--kv-memory", default=None, help="KV bytes per rank (default: the GPU's)")
    ap.add_argument("--max-model-len", type=int, default=32_768)
    ap.add_argument("--workload", choices=KINDS, default="chat")
    ap.add_argument("--limits", choices=("exact", "client"), default="exact")
    ap.add_argument("--load", type=float, default=1.5, help="× the sustainable rate")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--dilation", type=float, default=10.0)
    ap.add_argument("--ttft-slo-s", type=float, default=2.0, help="modelled seconds")
    ap.add_argument("--queue-wait-ms", type=int, default=QUEUE_WAIT_MS, help="modelled")
    ap.add_argument("--arms", default="direct,reserve,forecast")
    ap.add_argument("--workdir", type=Path, default=Path(".scratch/gpu_pool"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    k = args.dilation
    spec = PoolSpec(
        model=args.model,
        tp=args.tp or MODELS[args.model],
        kv_memory_bytes=None if args.kv_memory is None else parse_size(args.kv_memory),
        max_model_len=args.max_model_len,
        dilation=k,
    )
    seeds = [int(s) for s in args.seeds.split(",")]
    plans: dict[int, list[Planned]] = {}
    header: dict[str, Any] = {
        "what": "real vLLM scheduler, modelled compute (docs/gpu-pool.md)",
        "model": spec.model,
        "tp": spec.tp,
        "gpu": spec.gpu.name,
        "num_blocks": spec.num_blocks,
        "block_size": spec.block_size,
        "max_model_len": spec.max_model_len,
        "dilation": k,
        "workload": args.workload,
        "limits": args.limits,
        "load": args.load,
        "ttft_slo_s": args.ttft_slo_s,
        "rates": {},
    }
    for seed in seeds:
        base = plan_gpu(
            args.workload, args.requests, 1.0, seed=seed, max_model_len=spec.max_model_len
        )
        rate = sustainable_rate(spec, base)
        header["rates"][seed] = round(rate, 3)
        plans[seed] = plan_gpu(
            args.workload,
            args.requests,
            args.load * rate,
            seed=seed,
            max_model_len=spec.max_model_len,
            limits=args.limits,
        )
    print(json.dumps(header), file=sys.stderr)
    groups = _groups([a.strip() for a in args.arms.split(",") if a.strip()])
    if args.dry_run:
        span = max(p[-1].at_s for p in plans.values()) * k
        print(f"{len(groups)} stacks, {len(seeds)} seeds; wall span per run ≈ {span:.0f} s + drain")
        return 0
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for admission, valve, arms in groups:
        queued = "-queue" if "slo-queue" in arms else ""
        workdir = (
            args.workdir.resolve() / f"{admission}-{valve.name if valve else 'novalve'}{queued}"
        )
        workdir.mkdir(parents=True, exist_ok=True)
        policy = gpu_policy(
            workdir / "policy-gpu.yaml",
            max_model_len=spec.max_model_len,
            k=k,
            admission=admission,
            read_floors=args.limits == "exact",
            ttft_slo_s=args.ttft_slo_s,
        )
        with overload_setup(
            workdir,
            policy=policy,
            serve=serve_config(spec, workdir / "vllm"),
            valve=valve,
            queue="queue" in arms or "slo-queue" in arms,
            queue_wait_ms=round(args.queue_wait_ms * k),
        ) as setup:
            for seed in seeds:
                modes = [_mode(a) for a in arms]
                results = compare(
                    setup,
                    wall_plan(plans[seed], k),
                    rounds=1,
                    modes=modes,
                    ttft_slo_s=args.ttft_slo_s * k,
                    seed_offset=1_000_000 * seed,
                )
                by_mode = {r.mode: r for r in results}
                rows += [_row(a, seed, by_mode[_mode(a)], k) for a in arms]
                print(
                    f"[gpu_pool] {admission} seed {seed} done at {time.monotonic() - t0:.0f} s",
                    file=sys.stderr,
                )
    rows.sort(key=lambda r: (r["arm"], r["seed"]))
    print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
