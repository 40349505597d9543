"""Do N ICE replicas behind Envoy over-admit the pool? One burst per setting, counted client side.

The command line of ``ext_proc/lab/replicas/`` (which does the work, typed and tested).

```
burst ─► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE 0..N-1 (`ice serve --workers 1` each)
           └──────────────────────────────────────────────► backend (dev, or the tiny vLLM)
```

Settings: every N of ``--replicas`` (default 1,2,4) × every shape of ``--shapes`` (default
local,redis,standby):

- ``local``: plain round robin over N replicas, each with its own in-flight ledger (the
  shipped ``envoy/envoy.yaml``): each replica believes it owns the pool's free blocks;
- ``redis``: the same, every replica also ``--ledger redis://127.0.0.1:P/0`` on one Redis
  (``ext_proc.lab.redis_local``, started here unless ``--redis-url`` names one; flushed
  before each setting);
- ``standby``: Envoy's ``ice`` cluster in priority levels
  (``render_envoy_config(..., standby_clusters=("ice",))``): replica 0 judges everything,
  the others stand by.

A shape this checkout cannot run yet (``ice serve`` without ``--ledger``,
``render_envoy_config`` without ``standby_clusters``) is listed and its rows say why.

Per setting: fresh replicas and Envoy, then ``--rounds`` (3) × (the burst; the backend left
to settle; the latency probe). The burst: ``--requests`` (24) streamed chat completions
released at one instant, each ``--prompt-words`` words + ``--max-tokens`` output, sized so
that ~6 fit the pool at once. Backend ``dev`` (default): the dev backend with a pool of
``--num-gpu-blocks`` (64) × ``--block-size`` (16), idle gauges, policy
``ext_proc/lab/replicas/dev_policy.yaml`` (scrape 0.1 s, ``kv_hold: done``,
``on_kv_shortfall: shed``), each stream slowed by ``--stream-delay-ms`` (130) per SSE event
(~20 events: ~2.5 s in flight); 89 three-letter words + 60 output = 153 tokens = 10 blocks,
6 fit the 63 usable. Backend ``vllm``: the overload lab's tiny vLLM (24 × 128 blocks; needs
``.venv-vllm``, ``make vllm-install``) with ``ext_proc/lab/vllm_tiny_policy.yaml`` (less
truncation); 300 filler words + 100 output ≈ 4 blocks, 5 fit the 23 usable.

Per round: admitted (not 429), 429s, other non-2xx, unjudged (no ``x-mem-pressure``: ICE did
not answer and Envoy failed open), the peak of the KV blocks the admitted requests held at
once (each from its start to its end, with ceil((prompt + max_tokens) / block_size) blocks,
the prompt tokens from the answer's ``usage``), over-admission = max(0, peak − (num_gpu_blocks
− 1)), vLLM's ``vllm:num_preemptions_total`` delta (vLLM only), and ICE's added latency
p50 / p99: ``--probe-requests`` (200) tiny requests (``max_tokens`` 1, not streamed, one at a
time over one connection) through Envoy, minus the same straight to the backend, alternated.
Output: a markdown table (a row per setting, each metric ``median [min–max]`` over the
rounds), and ``--out FILE`` the JSON (parameters, every round with every answer).

Scenarios instead of the sweep (either or both; ``--sweep`` to run the sweep too):

- ``--failover``: every shape of ``--failover-shapes`` (standby,local,redis) with each count
  of ``--failover-replicas`` (2,4; standby: 2), each fault of ``--failover-faults``
  (kill,stop): ``--failover-clients`` (4) loops of tiny requests (``--failover-gap-ms`` 50
  between) through Envoy; replica 0 (standby: the active one) SIGKILLed (kill: a crash) or
  SIGSTOPped (stop: a hang) after ``--failover-kill-after-s`` (2), the load kept
  ``--failover-after-s`` (5) more; ``--failover-back-after-s`` (2) after the fault the
  replica is restarted on its address (kill) or continued (stop). Reports, per scenario, the
  answers without ICE's verdict header (passed unjudged while Envoy still sent to the faulted
  replica), the window from the first to the last of them, the errors (non-2xx) by status,
  and how long after it was back the replica judged a request again (its metrics page);
  ``--failover-rounds`` (1) runs of each, the table ``median [min–max]`` over them.
- ``--crash``: shape redis, 2 replicas: the burst fills the pool; once every request of it
  has its verdict, the replica that passed most of it (ICE's own pass counters) is
  SIGKILLed, its admitted requests still streaming; then a probe every ``--crash-probe-ms``
  (200) until one is judged and passed (≤ ``--crash-timeout-s``, 30), sized to fit only
  once the dead replica's blocks are gone (usable − its blocks + 1: its burst prompt, a
  larger ``max_tokens``). The burst's streams are short (``--crash-stream-delay-ms`` 25 per
  event on the dev backend: ~0.5 s), so they end before the ledger's TTL can. Reports how
  long after the kill, and after the burst's last stream ended, the pool admitted again:
  the dead replica's reservations must leave the shared ledger by its TTL (``ice serve
  --ledger-ttl-s``, 3 s by default; ``--ice-arg`` passes it), so the first figure should sit
  between TTL − heartbeat and TTL, and a pool that never admits again within the timeout is
  a leak.

``--ice-arg ARG`` (repeatable) goes to every ``ice serve``; ``--vllm-arg`` to ``vllm serve``.
``--dry-run`` prints the plan, the availability of each shape and an estimate, and starts
nothing.

    .venv/bin/python bench/replicas.py --dry-run
    .venv/bin/python bench/replicas.py --replicas 1,2,4 --shapes local,redis,standby \\
        --rounds 3 --out replicas.json
    .venv/bin/python bench/replicas.py --replicas 2 --shapes local --rounds 1
    .venv/bin/python bench/replicas.py --failover
    .venv/bin/python bench/replicas.py --failover --failover-rounds 3 --failover-after-s 6
    .venv/bin/python bench/replicas.py --crash --ice-arg=--ledger-ttl-s=3
    .venv/bin/python bench/replicas.py --backend vllm --replicas 1,2 --rounds 3

Time (2-core machine, dev backend): ~2 s per replica and ~2 s for Envoy per setting, ~5 s per
round (2.5 s of streams, the settle, the probe); the default sweep (9 settings × 3 rounds)
~3 min. ``--dry-run`` prints the estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))

from ext_proc.lab.replicas import (  # noqa: E402
    BACKENDS,
    DEV_POLICY,
    DEV_STATE,
    SHAPES,
    Backend,
    BurstPlan,
    CrashResult,
    FailoverResult,
    SettingResult,
    crash,
    crash_text,
    dev_backend,
    document,
    estimate_s,
    failover,
    failover_table,
    failover_text,
    plan_text,
    settings,
    shape_available,
    sweep,
    table,
    vllm_backend,
)

# Per backend: prompt words, max_tokens (see the module docstring for why these sizes).
SIZES = {"dev": (89, 60), "vllm": (300, 100)}
# The prompt tokens each backend counts for a one-message chat of W words: the dev backend
# counts words + 4 per message; the tiny tokenizer reads each filler word as one token and
# its chat template adds ~17.
PROMPT_OVERHEAD = {"dev": 4, "vllm": 17}
VLLM_POOL = (128, 24)  # block_size, num_gpu_blocks of ext_proc.lab.vllm_local.ServeConfig
DEV_EVENTS = 20  # SSE events of a dev stream of ≥ 16 words (role, 16 words, end, usage, DONE)


def parse_ints(spec: str, flag: str) -> list[int]:
    try:
        out = [int(p) for p in spec.split(",") if p.strip()]
    except ValueError as e:
        raise ValueError(f"{flag}: want N,N,... ({e})") from e
    if not out:
        raise ValueError(f"{flag}: none given")
    return out


def parse_shapes(spec: str) -> list[str]:
    out = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [s for s in out if s not in SHAPES]
    if bad or not out:
        raise ValueError(f"--shapes: want some of {','.join(SHAPES)}, not {spec!r}")
    return out


def burst_plan(args: argparse.Namespace) -> BurstPlan:
    words, max_tokens = SIZES[args.backend]
    words = args.prompt_words or words
    max_tokens = args.max_tokens or max_tokens
    return BurstPlan(
        requests=args.requests,
        prompt_words=words,
        max_tokens=max_tokens,
        stream_delay_ms=args.stream_delay_ms if args.backend == "dev" else 0.0,
        prompt_tokens=words + PROMPT_OVERHEAD[args.backend],
    )


def pool_of(args: argparse.Namespace) -> tuple[int, int]:
    """(block_size, num_gpu_blocks) as planned (vLLM's are read from it once it runs)."""
    return (args.block_size, args.num_gpu_blocks) if args.backend == "dev" else VLLM_POOL


@contextlib.contextmanager
def backend_of(args: argparse.Namespace, workdir: Path) -> Iterator[Backend]:
    if args.backend == "dev":
        with dev_backend(
            workdir / "backend",
            num_gpu_blocks=args.num_gpu_blocks,
            block_size=args.block_size,
            policy=args.policy or DEV_POLICY,
        ) as backend:
            yield backend
    else:
        kwargs: dict[str, Any] = {"policy": args.policy} if args.policy else {}
        with vllm_backend(workdir / "backend", vllm_args=args.vllm_arg, **kwargs) as backend:
            yield backend


@contextlib.contextmanager
def ledger_of(args: argparse.Namespace, workdir: Path, wanted: bool) -> Iterator[str | None]:
    """The shared ledger's URL: ``--redis-url``, else a Redis started here when a redis
    setting or the crash scenario can run; None otherwise (those then say why)."""
    if not wanted or shape_available("redis") is not None:
        yield None
        return
    if args.redis_url:
        yield args.redis_url
        return
    from ext_proc.lab.redis_local import RedisMissing, RedisStartError, start_redis

    try:
        server = start_redis(workdir / "redis")
    except (RedisMissing, RedisStartError) as e:
        print(f"[replicas] no Redis: {e}", file=sys.stderr)
        yield None
        return
    with server:
        yield server.url


def failover_matrix(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(shape, replicas, fault) of each failover scenario: standby runs 2 replicas only."""
    shapes = [s for s in args.failover_shapes.split(",") if s]
    counts = [int(n) for n in args.failover_replicas.split(",") if n]
    faults = [f for f in args.failover_faults.split(",") if f]
    out: list[tuple[str, int, str]] = []
    for shape in shapes:
        for n in [2] if shape == "standby" else counts:
            out += [(shape, n, fault) for fault in faults]
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", choices=BACKENDS, default="dev")
    ap.add_argument("--replicas", default="1,2,4", help="N of each setting (default 1,2,4)")
    ap.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"some of {','.join(SHAPES)} (default all)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24, help="the burst's size (default 24)")
    ap.add_argument(
        "--prompt-words", type=int, default=None, help="dev 89, vllm 300 (the defaults)"
    )
    ap.add_argument("--max-tokens", type=int, default=None, help="dev 60, vllm 100")
    ap.add_argument("--stream-delay-ms", type=float, default=130.0, help="dev: per SSE event")
    ap.add_argument("--num-gpu-blocks", type=int, default=DEV_STATE["num_gpu_blocks"])
    ap.add_argument("--block-size", type=int, default=DEV_STATE["block_size"])
    ap.add_argument("--probe-requests", type=int, default=200, help="latency probe, each way")
    ap.add_argument("--policy", type=Path, default=None, help="policy template to render")
    ap.add_argument("--ice-arg", action="append", default=[], help="to every ice serve")
    ap.add_argument("--vllm-arg", action="append", default=[], help="to vllm serve")
    ap.add_argument("--redis-url", default=None, help="an existing Redis for the ledger")
    ap.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    ap.add_argument("--sweep", action="store_true", help="the sweep too, with a scenario")
    ap.add_argument("--failover", action="store_true", help="the failover scenarios")
    ap.add_argument("--failover-shapes", default="standby,local,redis")
    ap.add_argument("--failover-replicas", default="2,4", help="standby: 2 only")
    ap.add_argument("--failover-faults", default="kill,stop")
    ap.add_argument("--failover-back-after-s", type=float, default=2.0)
    ap.add_argument("--failover-rounds", type=int, default=1, help="runs of each scenario")
    ap.add_argument("--failover-clients", type=int, default=4)
    ap.add_argument("--failover-gap-ms", type=float, default=50.0)
    ap.add_argument("--failover-kill-after-s", type=float, default=2.0)
    ap.add_argument("--failover-after-s", type=float, default=5.0)
    ap.add_argument("--crash", action="store_true", help="the redis crash scenario")
    ap.add_argument("--crash-probe-ms", type=float, default=200.0)
    ap.add_argument("--crash-timeout-s", type=float, default=30.0)
    ap.add_argument(
        "--crash-stream-delay-ms",
        type=float,
        default=25.0,
        help="dev: the crash burst's delay per SSE event (~0.5 s streams: they end before "
        "the ledger's TTL can)",
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        pairs = settings(parse_ints(args.replicas, "--replicas"), parse_shapes(args.shapes))
        if args.rounds < 1 or args.requests < 1:
            raise ValueError("--rounds and --requests must be ≥ 1")
        plan = burst_plan(args)
    except ValueError as e:
        ap.error(str(e))
    run_sweep = args.sweep or not (args.failover or args.crash)
    if not run_sweep:
        pairs = []
    shapes_used = {s for s, _ in pairs} | (
        {s for s, _, _ in failover_matrix(args)} if args.failover else set()
    )
    shapes_used |= {"redis"} if args.crash else set()
    unavailable = {s: why for s in sorted(shapes_used) if (why := shape_available(s))}
    block_size, blocks = pool_of(args)
    print(
        plan_text(
            args.backend,
            block_size,
            blocks,
            plan,
            pairs,
            unavailable,
            args.rounds,
            args.probe_requests,
        )
    )
    stream_s = DEV_EVENTS * args.stream_delay_ms / 1000 if args.backend == "dev" else 8.0
    est = estimate_s(
        pairs,
        args.rounds,
        plan,
        args.probe_requests,
        vllm=args.backend == "vllm",
        stream_s=stream_s,
    )
    failovers = len(failover_matrix(args)) * args.failover_rounds if args.failover else 0
    est += 15.0 * failovers + 15.0 * args.crash
    scenarios = [name for name, on in (("failover", args.failover), ("crash", args.crash)) if on]
    if scenarios:
        print(f"scenarios: {', '.join(scenarios)}")
    print(f"estimate: ~{est / 60:.1f} min")
    if args.dry_run:
        return 0
    params: dict[str, Any] = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
    }
    params["plan"] = plan.__dict__
    params["unavailable"] = unavailable
    results: list[SettingResult] = []
    failed_over: list[FailoverResult] = []
    crashed: CrashResult | None = None
    with contextlib.ExitStack() as es:
        workdir = args.workdir or Path(es.enter_context(tempfile.TemporaryDirectory()))
        wants_redis = args.crash or any(s == "redis" for s, _ in pairs)
        wants_redis = wants_redis or (args.failover and "redis" in args.failover_shapes)
        backend = es.enter_context(backend_of(args, workdir))
        ledger = es.enter_context(ledger_of(args, workdir, wants_redis))
        params["pool"] = {
            "block_size": backend.block_size,
            "num_gpu_blocks": backend.num_gpu_blocks,
        }
        if pairs:
            results = sweep(
                backend,
                pairs,
                plan,
                rounds=args.rounds,
                probe_requests=args.probe_requests,
                workdir=workdir,
                ledger_url=ledger,
                ice_args=args.ice_arg,
            )
        if args.failover:
            for (shape, n, fault), _ in itertools.product(
                failover_matrix(args), range(args.failover_rounds)
            ):
                failed_over.append(
                    failover(
                        backend,
                        workdir / f"failover-{shape}-{n}-{fault}",
                        shape=shape,
                        replicas=n,
                        fault=fault,
                        clients=args.failover_clients,
                        kill_after_s=args.failover_kill_after_s,
                        after_s=args.failover_after_s,
                        gap_s=args.failover_gap_ms / 1000,
                        back_after_s=args.failover_back_after_s,
                        ice_args=args.ice_arg,
                        ledger_url=ledger if shape == "redis" else None,
                    )
                )
        if args.crash:
            crashed = crash(
                backend,
                workdir / "crash",
                dataclasses.replace(plan, stream_delay_ms=args.crash_stream_delay_ms),
                ledger_url=ledger,
                probe_gap_s=args.crash_probe_ms / 1000,
                timeout_s=args.crash_timeout_s,
                ice_args=args.ice_arg,
            )
    print()
    if results:
        print(table(results))
    for f in failed_over:
        print(failover_text(f))
    if failed_over:
        print(failover_table(failed_over))
    if crashed:
        print(crash_text(crashed))
    if args.out is not None:
        doc = document(params, results, failed_over, crashed)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
