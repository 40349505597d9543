"""One overload burst sent to a real vLLM in each mode: straight to it, through Envoy + ICE,
and through Envoy + an ICE that queues.

The command line of ``ext_proc/lab/overload/`` (which does the work; ``ice demo`` uses it too).

```
burst ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
       ├─ ice ───► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/lab/vllm_tiny_policy.yaml)
       │             └─────────────────────────────────► same vllm serve
       └─ queue ─► 2nd Envoy ─ext_proc─► 2nd ICE (same policy + `queue:` in every profile)
                     └─────────────────────────────────► same vllm serve
```

The burst: ``--requests`` streamed chat completions of ~``--prompt-tokens`` prompt tokens and
``--max-tokens`` output tokens (``ignore_eos``), started ``--spacing-ms`` apart on a fixed
schedule (open loop: a request never waits for another to finish), priorities interleaved
from ``--mix`` and, with ``--tenants heavy=4,light=1``, a tenant per request interleaved the
same way (weight = relative rate), sent as ``x-tenant``. The same burst (same sizes,
priorities, tenants and schedule; fresh prompt text per run, so no run reuses another's prefix
cache) goes once per mode of ``--modes``, with vLLM idle in between (running = waiting = 0);
the order rotates by one per round (two modes: alternating). Give ``--rounds 3`` or more to
read the spread.

Modes (``--modes``, default ``direct,ice``):
- ``direct``: straight to vLLM;
- ``ice``: through Envoy + ICE with ``--policy``;
- ``queue``: through a second Envoy + a second ICE whose policy is ``--policy`` with
  ``queue: {enabled: true, max_queue_wait_ms: --queue-wait-ms, max_queue_length:
  --queue-length, tenant_header: x-tenant, max_tenants: 16}`` in every profile: a request ICE
  would refuse (429 ``memory_pressure`` / ``kv_exhausted``) waits for room and then passes
  with ``x-ice-queued-ms``, or gets 429 ``queue_timeout`` / ``queue_full``. Only started when
  asked; an ICE whose policy schema has no ``queue`` fails at once (before vLLM starts).
``--ice-workers N``: each ICE runs ``--workers N`` (Envoy balances over them).

``--tenant-alone light``: per round, each mode also runs a control: only light's requests of
the plan, at their planned times (the rows ``<mode> light alone``), to read what the other
tenants cost it.

Per request: status, latency, time to first token (or to the 429), output tokens
(``usage.completion_tokens``), ``Retry-After``, ICE's verdict headers, ``x-ice-queued-ms``.
Per run: 200s; 429s by reason; other answers by status (``0``: transport error); requests
queued and their queued ms p50 / p95 / max; TTFT and end-to-end p50 / p95 / max of the 200s;
the drain time (from the start to the end of the last request); completion tokens per second
of drain time; goodput; from vLLM's /metrics the ``vllm:num_preemptions_total`` delta, vLLM's
mean queue time and (sampled every ``--sample-ms``) the peak of waiting, running and KV usage;
Envoy's ext_proc stats (did any request pass unjudged: fail-open); with tenants, per tenant:
requests, 200s, 429s, queued, queued ms p95 (over its queued requests: the wait ICE added)
and TTFT p95.

Goodput = Σ completion tokens of the 200s with TTFT ≤ ``--ttft-slo-s`` (default 2.0 s) /
drain time, in tokens per second: the output that came soon enough to count.

Output: the per-run table (a column per run), then one row per mode with each metric's
``median [min–max]`` over the rounds, then the per-tenant rows; ``--json`` writes all of it
per run (summaries, shots, vLLM timeline, Envoy counters) plus the spreads.

    .venv/bin/python bench/overload.py                 # 24 requests, 3 rounds, table
    .venv/bin/python bench/overload.py --rounds 1 --json out.json
    .venv/bin/python bench/overload.py --spacing-ms 0  # all at once (see below)
    .venv/bin/python bench/overload.py --modes direct,ice,queue --tenants heavy=4,light=1 \
        --tenant-alone light --rounds 3

Needs ``.venv-vllm`` (``make vllm-install``): ~25 s to start vLLM, ~30 s a round per mode.

Set-up choices:
- ICE's scraper runs in every mode, so vLLM serves the same /metrics load in each (with
  ``queue`` in ``--modes`` two ICEs scrape it, in every mode, and two Envoys run).
- The queue ICE holds a request past Envoy's 1 s ``message_timeout`` by asking for its wait
  (``override_message_timeout``, at most the config's ``max_message_timeout`` of 60 s), so
  ``--queue-wait-ms`` must stay under 59000.
- ``--vllm-nice N`` lowers vLLM's CPU priority (all its processes). On a 2-core machine vLLM
  wants ~2.5 cores (API server, engine core, worker), and at 150 ms spacing up to 6 of 24
  verdicts a round missed Envoy's 1 s ``message_timeout`` and passed unjudged (fail-open,
  the "ICE fail-open" row). At 250 ms spacing none did, at nice 0 or 10, and the counts did
  not differ, so the default leaves vLLM's priority alone.

What limits the effect (see the report's ``timeline``):
- ICE judges each request against the last scrape less the blocks of the requests it passed
  since (``Pipeline._room``). Before that ledger (29 Nov) a burst that arrived faster than
  vLLM's gauges move passed on one idle view: with ``--spacing-ms 0`` every request passed
  and vLLM preempted as often as without ICE. With it (30 Nov, 3 rounds, spacing 0):
  preemptions 15/15/15 straight vs 2/3/3 through ICE (17-18 of 24 shed, kv_exhausted),
  longest wait for a first token 6.6-7.1 s vs 1.4-1.9 s.
- vLLM refreshes running / waiting / KV usage between engine steps, and requests its API
  server has accepted but not yet scheduled count nowhere; on this CPU the gauges lag by
  0.1-1 s and now and then read 0 running / 0 waiting while requests stream.
- ``critical`` requests are never shed, so they still push a third request into the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))

from ext_proc.lab.overload import (  # noqa: E402
    DEFAULT_MODES,
    MAX_TOKENS,
    MIX,
    MODES,
    POLICY,
    PROMPT_TOKENS,
    QUEUE_LENGTH,
    QUEUE_WAIT_MS,
    REQUESTS,
    SPACING_MS,
    TENANT_HEADER,
    TTFT_SLO_S,
    VLLM_ARGS,
    VLLM_NICE,
    Planned,
    QueuePolicyError,
    alone,
    compare,
    overload_setup,
    plan_burst,
    report,
    table,
    tenant_table,
    totals,
)


def parse_modes(spec: str) -> list[str]:
    """``"direct,ice,queue"`` → the modes in that order; ValueError for an unknown or
    repeated one, or none."""
    modes = [m.strip() for m in spec.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise ValueError(f"bad --modes {spec!r}: want some of {','.join(MODES)}, each once")
    return modes


def controls_of(burst: list[Planned], tenant: str | None) -> dict[str, list[Planned]]:
    """``--tenant-alone``'s control burst, by its name (none without the flag)."""
    return {} if tenant is None else {f"{tenant} alone": alone(burst, tenant)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="filler words")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--spacing-ms", type=float, default=SPACING_MS, help="between starts")
    ap.add_argument("--mix", default=MIX, help="priority weights, e.g. standard=3,sheddable=2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample-ms", type=float, default=100.0)
    ap.add_argument("--policy", type=Path, default=POLICY)
    ap.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    ap.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"some of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})",
    )
    ap.add_argument("--ice-workers", type=int, default=1, help="ICE --workers (each ICE)")
    ap.add_argument(
        "--queue-wait-ms", type=int, default=QUEUE_WAIT_MS, help="queue mode: max_queue_wait_ms"
    )
    ap.add_argument(
        "--queue-length", type=int, default=QUEUE_LENGTH, help="queue mode: max_queue_length"
    )
    ap.add_argument(
        "--ttft-slo-s", type=float, default=TTFT_SLO_S, help="goodput counts TTFT ≤ this"
    )
    ap.add_argument(
        "--tenants",
        default=None,
        help=f"tenant weights sent as {TENANT_HEADER}, e.g. heavy=4,light=1",
    )
    ap.add_argument(
        "--tenant-alone",
        default=None,
        metavar="TENANT",
        help="also run a control per mode: only this tenant's requests, same times",
    )
    ap.add_argument("--vllm-nice", type=int, default=VLLM_NICE, help="nice of vLLM (0: as is)")
    ap.add_argument("--vllm-arg", action="append", default=list(VLLM_ARGS), help="to vllm serve")
    ap.add_argument(
        "--json", type=Path, default=None, help="write the full report here (- = stdout)"
    )
    args = ap.parse_args(argv)
    try:
        modes = parse_modes(args.modes)
        burst = plan_burst(
            args.requests,
            args.prompt_tokens,
            args.max_tokens,
            args.spacing_ms,
            args.mix,
            args.tenants,
        )
        if args.tenant_alone is not None and args.tenants is None:
            raise ValueError("--tenant-alone needs --tenants")
        controls = controls_of(burst, args.tenant_alone)
        if args.ice_workers < 1:
            raise ValueError("--ice-workers must be ≥ 1")
    except ValueError as e:
        ap.error(str(e))
    params = {
        "requests": args.requests,
        "prompt_filler_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "spacing_ms": args.spacing_ms,
        "mix": args.mix,
        "policy": str(args.policy),
        "modes": modes,
        "rounds": args.rounds,
        "ice_workers": args.ice_workers,
        "ttft_slo_s": args.ttft_slo_s,
        "tenants": args.tenants,
        "tenant_alone": args.tenant_alone,
        "tenant_header": TENANT_HEADER,
        **(
            {"queue_wait_ms": args.queue_wait_ms, "queue_length": args.queue_length}
            if "queue" in modes
            else {}
        ),
    }
    with contextlib.ExitStack() as es:
        workdir = args.workdir or Path(es.enter_context(tempfile.TemporaryDirectory()))
        try:
            setup = es.enter_context(
                overload_setup(
                    workdir,
                    policy=args.policy,
                    vllm_args=args.vllm_arg,
                    vllm_nice=args.vllm_nice,
                    ice_workers=args.ice_workers,
                    queue="queue" in modes,
                    queue_wait_ms=args.queue_wait_ms,
                    queue_length=args.queue_length,
                    tenant_header=TENANT_HEADER,
                )
            )
        except QueuePolicyError as e:
            print(f"[overload] {e}", file=sys.stderr)
            return 2
        print(f"[overload] vLLM up in {setup.vllm.startup_s:.1f} s", file=sys.stderr)
        results = compare(
            setup,
            burst,
            rounds=args.rounds,
            sample_s=args.sample_ms / 1000,
            modes=modes,
            ttft_slo_s=args.ttft_slo_s,
            controls=controls,
        )
    full = report(results, burst, params)
    if args.json is not None and str(args.json) == "-":
        print(json.dumps(full, indent=1))
        return 0
    if args.json is not None:
        args.json.write_text(json.dumps(full, indent=1) + "\n")
    print(table(results))
    print()
    print(totals(results))
    by_tenant = tenant_table(results)
    if by_tenant:
        print()
        print(by_tenant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
