"""One overload workload sent to a real vLLM in each arm: straight to it, through Envoy + ICE,
through Envoy + an ICE that queues, and against vLLM's own admission valve (with or without
ICE in front of it).

The command line of ``ext_proc/lab/overload/`` (which does the work; ``ice demo`` uses it too).

```
plan ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
      ├─ ice ───► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/lab/vllm_tiny_policy.yaml)
      │             └─────────────────────────────────► same vllm serve
      └─ queue ─► 2nd Envoy ─ext_proc─► 2nd ICE (same policy + `queue:` in every profile)
                    └─────────────────────────────────► same vllm serve
then, per valve setting, a fresh stack whose vllm serve has --max-num-queued-reqs N (or
--max-num-queued-tokens T):
      ├─ valve:reqs=N ─────────────────────────────────► vllm serve --max-num-queued-reqs N
      └─ ice+valve:reqs=N ─► Envoy ─ext_proc─► ICE ────► same vllm serve
```

Workloads (``--workload``, default ``burst``):

- ``burst``: ``--requests`` streamed chat completions of ~``--prompt-tokens`` (870) filler
  words and ``--max-tokens`` (200) output tokens (``ignore_eos``), started ``--spacing-ms``
  apart on a fixed schedule (open loop: a request never waits for another to finish),
  priorities interleaved from ``--mix`` and, with ``--tenants heavy=4,light=1``, a tenant per
  request interleaved the same way (weight = relative rate), sent as ``x-tenant``.
- ``mixed`` (``ext_proc/lab/overload/workload.py``, seeded by ``--seed``, default 1):
  ``--requests`` requests, round(30 %) of them long at positions drawn from the seed, the
  rest short; short: prompt uniform 80–120 filler words (≈ 97–137 tokens), output
  lognormal(median 32, σ 1.0), ≥ 8; long: prompt uniform 1000–1200 words (8–10 of the pool's
  23 usable blocks of 128), output lognormal(median 160, σ 1.0), ≥ 32; every output clipped
  so that prompt + output + 32 (chat template margin) + 128 (the policy's
  ``output_buffer_tokens``) ≤ 2048 (``max_model_len``): vLLM never answers 400 and ICE never
  cuts ``max_tokens`` for the context (under pressure it may: ``max_tokens_cap``);
  priorities (``--mix``), tenants (``--tenants``) and ``--spacing-ms`` as in the burst,
  independent of the sizes. ``--prompt-tokens`` / ``--max-tokens`` do not apply. The report
  header prints every parameter and the plan's sizes.

The same plan (same sizes, priorities, tenants and schedule; fresh prompt text per run, so no
run reuses another's prefix cache) goes once per arm per round, with vLLM idle in between
(running = waiting = 0); the order rotates by one per round (two arms: alternating). Give
``--rounds 3`` or more to read the spread.

Arms (``--modes``, default ``direct,ice``, comma-separated, each once):

- ``direct``: straight to vLLM;
- ``ice``: through Envoy + ICE with ``--policy``;
- ``queue``: through a second Envoy + a second ICE whose policy is ``--policy`` with
  ``queue: {enabled: true, max_queue_wait_ms: --queue-wait-ms, max_queue_length:
  --queue-length, tenant_header: x-tenant, max_tenants: 16, critical: --queue-critical}`` in
  every profile: a request ICE would refuse (429 ``memory_pressure`` / ``kv_exhausted``) waits
  for room and then passes with ``x-ice-queued-ms``, or gets 429 ``queue_timeout`` /
  ``queue_full`` (with ``--queue-critical wait`` a ``critical`` one whose blocks do not fit
  waits too, and passes at the deadline: never refused). Only started when
  asked; an ICE whose policy schema has no ``queue`` fails at once (before vLLM starts);
- ``valve:reqs=N`` / ``valve:tokens=T``: straight to a vLLM started with vLLM 0.32's own
  admission valve, checked in its API server before the request is rendered, 503 either way:
  ``--max-num-queued-reqs N`` refuses when the requests in flight (waiting + running) plus
  the new one's ``n`` exceed N; ``--max-num-queued-tokens T`` refuses when the prompt tokens
  of the requests still in prefill (waiting ones included, each with its whole prompt until
  its first token) are already ≥ T (the new prompt is not counted, so one can overshoot);
  counted in ``vllm:admission_rejections_total{reason=max_num_queued_reqs|tokens}``;
- ``ice+valve:reqs=N`` (or ``tokens=T``; ``queue+valve:...`` too): ICE in front of such a vLLM.

Sweeps: ``--valve-reqs 2,4,8`` and ``--valve-tokens 1024,2048`` add one arm per setting and
per front of ``--valve-with`` (default ``direct``; ``direct,ice`` adds ``ice+valve:...``
too), after the ``--modes`` arms. A valve is a server flag, so the arms are grouped by the
vLLM they need (one group per distinct valve: no valve first, then reqs and tokens by
limit) and each group gets its own stack (vLLM, ICE, Envoy, and the queue ICE when any arm
queues), started after the previous one stopped; within a group its arms rotate per round
as above. Every arm is printed. The default invocation is one group without a valve, as
before sweeps existed. A valve flag in ``--vllm-arg`` is refused (the arm's name would not
say so).

``--tenant-shares JSON`` (e.g. ``'{"caps": {"heavy": 0.5}, "guaranteed": {"light": 0.4}}'``):
every pool of both ICEs' policies gets that ``tenant_shares`` (docs/tenant-shares.md); the
tenant is ``x-tenant`` in the ``queue`` arm (its ``tenant_header``), the route's name in the
``ice`` arm. The tables then show ``ICE tenant blocks held max`` per tenant (ICE's
``ice_tenant_blocks_held``, sampled every ``--sample-ms``: the tenants the shares name, the
others as ``other``); ``'{"cap": 1.0, "caps": {"heavy": 1.0}}'`` counts without limiting.

``--fake-pool [sleep|burn]``: every group's vLLM is the fake pool instead of the tiny model
(``ext_proc.lab.gpupool.cpu_tiny``, docs/gpu-pool.md "Faithfulness"): vLLM's own API server,
scheduler and KV cache at the tiny model's geometry (24 blocks of 128, ``max_model_len``
2,048, 2,048 batched tokens, 128 sequences), with the forward pass replaced by a sleep of the
step time fitted to this CPU vLLM (k = 1): slept (``sleep``, the default), or computed on one
core (``burn``: the real forward pass takes a core from Envoy, ICE and the client; a sleep does
not). The same plan, policy and arms: to check that the fake pool reproduces the real one.

``--ice-workers N``: each ICE runs ``--workers N`` (Envoy balances over them).
``--tenant-alone light``: per round, each arm also runs a control: only light's requests of
the plan, at their planned times (the rows ``<arm> light alone``), to read what the other
tenants cost it.

Per request: status, latency, time to first token (or to the refusal), output tokens
(``usage.completion_tokens``), ``Retry-After``, ICE's verdict headers, ``x-ice-queued-ms``.
Per run: 200s; 429s by ICE's reason; 503s (vLLM's valve) by the valve their body names
(``reqs``, ``tokens``; ``-``: another 503, e.g. Envoy's), and vLLM's
``vllm:admission_rejections_total`` delta by reason (``valve Δ``); other answers by status
(``0``: transport error); requests queued and their queued ms p50 / p95 / max; TTFT and
end-to-end p50 / p95 / max of the 200s; the drain time (from the start to the end of the last
request); completion tokens per second of drain time; goodput; from vLLM's /metrics the
``vllm:num_preemptions_total`` delta, vLLM's mean queue time and (sampled every
``--sample-ms``) the peak of waiting, running and KV usage; Envoy's ext_proc stats (did any
request pass unjudged: fail-open); with tenants, per tenant: requests, 200s, 429s, queued,
queued ms p95 (over its queued requests: the wait ICE added), TTFT p95 and goodput (its own
200s with TTFT ≤ the SLO, per second of its own drain: t0 to the end of its last request); in
the mixed
workload, per size class: requests, 200s, 429s, 503s, TTFT p50 / p95, e2e p95, goodput.

Goodput = Σ completion tokens of the 200s with TTFT ≤ ``--ttft-slo-s`` (default 2.0 s) /
drain time, in tokens per second: the output that came soon enough to count.

Output: with valves or the mixed workload, a header (the workload's parameters and plan, the
arms and the vLLM of each); the per-run table (a column per run; one table per vLLM), then one
row per arm with each metric's ``median [min–max]`` over the rounds (the 503 and ``valve Δ``
columns appear when some run has them), then the per-class and per-tenant rows; ``--json``
writes all of it per run (summaries, shots, vLLM timeline, Envoy counters) plus the plan, the
vLLM groups and the spreads. ``--dry-run`` prints the header and a time estimate and starts
nothing.

    .venv/bin/python bench/overload.py                 # 24 requests, 3 rounds, table
    .venv/bin/python bench/overload.py --rounds 1 --json out.json
    .venv/bin/python bench/overload.py --spacing-ms 0  # all at once (see below)
    .venv/bin/python bench/overload.py --modes direct,ice,queue --tenants heavy=4,light=1 \\
        --tenant-alone light --rounds 3
    .venv/bin/python bench/overload.py --spacing-ms 0 --modes direct,ice,ice+valve:reqs=3 \\
        --valve-reqs 2,3,4,8 --valve-tokens 2048 --json valve-burst.json
    .venv/bin/python bench/overload.py --workload mixed --spacing-ms 100 \\
        --modes direct,ice,ice+valve:reqs=4 --valve-reqs 2,4,8 --valve-tokens 1024,2048
    .venv/bin/python bench/overload.py --workload mixed --valve-reqs 2,4 --dry-run

Needs ``.venv-vllm`` (``make vllm-install``). Time, from earlier runs on the 2-core machine:
~45–50 s per vLLM (vLLM up in 36–38 s, then ICE, Envoy, warm-up; the stop), and per run of
the 24-request burst at spacing 0 the drain (7.8–10.8 s straight or queued; 2–3 s when ICE or
a valve refuses most of it) plus ~1 s until vLLM is idle; spaced, add the span of the starts
(5.75 s at 250 ms). So an arm costs ~10–35 s for 3 rounds and each valve setting ~50 s more
for its vLLM; ``--dry-run`` prints the estimate (50 s per vLLM, 12 s + the span per run).

Set-up choices:

- ICE's scraper runs in every arm, so vLLM serves the same /metrics load in each (with
  ``queue`` in any arm two ICEs scrape it, in every group, and two Envoys run); every group,
  valve or not, starts the same processes.
- The queue ICE holds a request past Envoy's 1 s ``message_timeout`` by asking for its wait
  (``override_message_timeout``, at most the config's ``max_message_timeout`` of 60 s), so
  ``--queue-wait-ms`` must stay under 59000.
- ``--vllm-nice N`` lowers vLLM's CPU priority (all its processes). On a 2-core machine vLLM
  wants ~2.5 cores (API server, engine core, worker), and at 150 ms spacing up to 6 of 24
  verdicts a round missed Envoy's 1 s ``message_timeout`` and passed unjudged (fail-open,
  the "ICE fail-open" row). At 250 ms spacing none did, at nice 0 or 10, and the counts did
  not differ, so the default leaves vLLM's priority alone.
- Groups run one after the other, so a valve arm and ``direct`` are minutes apart on
  different vLLM processes: read their difference against each arm's spread.

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
- vLLM's valve counts requests or prompt tokens, not KV blocks: ``reqs=N`` admits N requests
  whatever their size, and ``tokens=T`` forgets a prompt once its first token comes, while
  its blocks (and its output's) stay in the cache; a preempted request, back in the queue to
  redo its prefill, no longer counts (vLLM 0.32, ``OutputProcessor.get_num_queued_tokens``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))

from ext_proc.lab.gpupool import cpu_tiny, serve_config  # noqa: E402
from ext_proc.lab.overload import (  # noqa: E402
    DEFAULT_MODES,
    LIMITS,
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
    WORKLOADS,
    Arm,
    GroupRun,
    MixedSpec,
    Planned,
    QueuePolicyError,
    RunResult,
    SweepError,
    VllmGroup,
    admission_policy,
    alone,
    estimate_s,
    group_arms,
    kind_table,
    overload_setup,
    parse_arms,
    parse_limits,
    plan_burst,
    plan_mixed,
    plan_text,
    report,
    shares_policy,
    sweep,
    sweep_arms,
    table,
    tenant_table,
    totals,
    valve_in_args,
)
from ext_proc.lab.overload.setup import Setup  # noqa: E402


@contextlib.contextmanager
def fake_pool_setup(workdir: Path, *, burn: bool = False, **kwargs: Any) -> Iterator[Setup]:
    """``overload_setup`` with the fake pool at the tiny model's geometry (``--fake-pool``)."""
    serve = serve_config(cpu_tiny(burn=burn), workdir / "fake-pool")
    with overload_setup(workdir, serve=serve, **kwargs) as setup:
        yield setup


def parse_modes(spec: str) -> list[str]:
    """``"direct,ice,valve:reqs=4"`` → the arms' names in that order; ValueError for an
    unknown or repeated one, or none."""
    return [a.name for a in parse_arms(spec)]


def arms_of(args: argparse.Namespace) -> list[Arm]:
    """``--modes`` and then the sweep's arms (``--valve-reqs`` / ``--valve-tokens`` ×
    ``--valve-with``); ValueError for a bad one or an arm given twice."""
    arms = parse_arms(args.modes)
    fronts = [m.strip() for m in args.valve_with.split(",") if m.strip()]
    arms += sweep_arms(
        parse_limits(args.valve_reqs, "--valve-reqs"),
        parse_limits(args.valve_tokens, "--valve-tokens"),
        fronts,
    )
    group_arms(arms)  # an arm of --modes repeated by the sweep fails here
    return arms


def plan_of(args: argparse.Namespace) -> list[Planned]:
    """The workload's plan; ValueError for flags that do not apply to it."""
    if args.workload == "mixed":
        sized = {"--prompt-tokens": args.prompt_tokens, "--max-tokens": args.max_tokens}
        given = [flag for flag, value in sized.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: not with --workload mixed (its sizes are drawn)")
        return plan_mixed(
            args.requests,
            args.spacing_ms,
            args.mix,
            args.tenants,
            seed=args.seed,
            spec=MixedSpec(long_share=args.long_share),
            limits=args.limits,
        )
    if args.limits != "exact" or args.long_share != MixedSpec().long_share:
        raise ValueError("--limits, --long-share: only with --workload mixed")
    prompt_words, max_tokens = burst_size(args)
    return plan_burst(
        args.requests, prompt_words, max_tokens, args.spacing_ms, args.mix, args.tenants
    )


def history_of(args: argparse.Namespace) -> list[Planned]:
    """``--history``'s plan: the mixed workload's sizes from another seed, unhurried."""
    if args.history <= 0:
        return []
    if args.workload != "mixed":
        raise ValueError("--history: only with --workload mixed")
    return plan_mixed(
        args.history,
        400.0,
        "critical=1",
        seed=args.seed + 1000,
        spec=MixedSpec(long_share=args.long_share),
        limits=args.limits,
    )


def burst_size(args: argparse.Namespace) -> tuple[int, int]:
    """The burst's prompt words and output tokens (the defaults where not given)."""
    prompt = PROMPT_TOKENS if args.prompt_tokens is None else args.prompt_tokens
    return prompt, MAX_TOKENS if args.max_tokens is None else args.max_tokens


def controls_of(burst: list[Planned], tenant: str | None) -> dict[str, list[Planned]]:
    """``--tenant-alone``'s control burst, by its name (none without the flag)."""
    return {} if tenant is None else {f"{tenant} alone": alone(burst, tenant)}


def is_plain(workload: str, groups: Sequence[VllmGroup]) -> bool:
    """The burst on one vLLM without a valve: printed exactly as before sweeps existed."""
    return workload == "burst" and len(groups) == 1 and groups[0].valve is None


def vllm_text(group: VllmGroup) -> str:
    """``vLLM without a valve`` or ``vLLM reqs=4 (--max-num-queued-reqs 4)``."""
    if group.valve is None:
        return "vLLM without a valve"
    return f"vLLM {group.name} ({' '.join(group.valve.vllm_args)})"


def header(params: dict[str, Any], burst: Sequence[Planned], groups: Sequence[VllmGroup]) -> str:
    """The report's header: the workload and its parameters, the plan's sizes, the arms and
    the vLLM each group runs (its valve flags)."""
    if params["workload"] == "mixed":
        spec = MixedSpec(long_share=params["mixed"]["long_share"])
        limits = (
            "; limits as clients send them: max_tokens 1024 or none, half each"
            if params.get("limits") == "client"
            else ""
        )
        what = f"mixed (seed {params['seed']}): {spec.text()}{limits}"
    else:
        what = (
            f"burst: ~{params['prompt_filler_tokens']} prompt words + "
            f"{params['max_tokens']} output tokens each"
        )
    tenants = f", tenants {params['tenants']}" if params["tenants"] else ""
    lines = [
        f"workload {what}",
        f"plan: {params['requests']} requests {params['spacing_ms']:g} ms apart, priorities "
        f"{params['mix']}{tenants}; {plan_text(burst)}",
        f"arms: {', '.join(params['modes'])}; {params['rounds']} rounds; TTFT SLO "
        f"{params['ttft_slo_s']:g} s",
    ]
    for g in groups:
        lines.append(f"{vllm_text(g)}: {', '.join(a.name for a in g.arms)}")
    return "\n".join(lines)


def emit(
    done: Sequence[GroupRun],
    burst: Sequence[Planned],
    params: dict[str, Any],
    groups: Sequence[VllmGroup],
    json_path: Path | None,
) -> None:
    """Print the tables of the runs in ``done`` (and write ``--json``)."""
    results: list[RunResult] = [r for g in done for r in g.results]
    full = report(results, burst, {**params, "vllm_groups": [g.record() for g in done]})
    if json_path is not None and str(json_path) == "-":
        print(json.dumps(full, indent=1))
        return
    if json_path is not None:
        json_path.write_text(json.dumps(full, indent=1) + "\n")
    plain = is_plain(params["workload"], groups)
    if not plain:
        print(header(params, burst, groups))
        print()
    for g in done:
        if not plain:
            print(f"runs on {vllm_text(g.group)}, up in {g.startup_s:.1f} s:")
        print(table(g.results))
        print()
    if not plain:
        print(f"workload {params['workload']}: arms × metrics over {params['rounds']} rounds")
    print(totals(results))
    for extra in (kind_table(results), tenant_table(results)):
        if extra:
            print()
            print(extra)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--workload", choices=WORKLOADS, default="burst", help="burst (default) or mixed"
    )
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help=f"burst: filler words (default {PROMPT_TOKENS})",
    )
    ap.add_argument(
        "--max-tokens", type=int, default=None, help=f"burst: output tokens (default {MAX_TOKENS})"
    )
    ap.add_argument("--seed", type=int, default=1, help="mixed: the plan's seed")
    ap.add_argument(
        "--limits",
        choices=LIMITS,
        default="exact",
        help="mixed: exact (max_tokens = the drawn length) or client (1024 or none, half each)",
    )
    ap.add_argument("--long-share", type=float, default=MixedSpec().long_share, help="mixed")
    ap.add_argument("--quantile", type=float, default=None, help="with --admission forecast")
    ap.add_argument("--margin", type=float, default=None, help="with --admission forecast")
    ap.add_argument(
        "--start-within-s",
        type=float,
        default=None,
        help="with --admission forecast: forecast.start_within_s (admit what starts by then)",
    )
    ap.add_argument(
        "--refine",
        choices=("on", "off"),
        default=None,
        help="with --admission forecast: forecast.refine (lengths per kind of request)",
    )
    ap.add_argument(
        "--history",
        type=int,
        default=0,
        help="mixed: first send N requests of the workload (seed + 1000, 400 ms apart) "
        "straight to each vLLM, so its output-length histogram holds a past",
    )
    ap.add_argument(
        "--admission",
        choices=("policy", "reserve", "forecast", "slo"),
        default="policy",
        help="ICE's admission in every profile (policy: as --policy says; slo: with the "
        "bench's --ttft-slo-s as each profile's slo.ttft_ms where it has no target)",
    )
    ap.add_argument(
        "--tenant-shares",
        default="",
        help='every pool\'s tenant_shares, as JSON, e.g. \'{"caps": {"heavy": 0.5}, '
        '"guaranteed": {"light": 0.4}}\' (docs/tenant-shares.md); the tenant is x-tenant '
        "in the queue arm, the route's name elsewhere",
    )
    ap.add_argument("--spacing-ms", type=float, default=SPACING_MS, help="between starts")
    ap.add_argument("--mix", default=MIX, help="priority weights, e.g. standard=3,sheddable=2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample-ms", type=float, default=100.0)
    ap.add_argument("--policy", type=Path, default=POLICY)
    ap.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    ap.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"arms: some of {','.join(MODES)}, valve:reqs=N, valve:tokens=T, ice+valve:... "
        f"(default {','.join(DEFAULT_MODES)})",
    )
    ap.add_argument("--valve-reqs", default=None, help="sweep: --max-num-queued-reqs, e.g. 2,4,8")
    ap.add_argument(
        "--valve-tokens", default=None, help="sweep: --max-num-queued-tokens, e.g. 1024,2048"
    )
    ap.add_argument(
        "--valve-with",
        default="direct",
        help="sweep: the fronts of each valve setting (default direct; e.g. direct,ice)",
    )
    ap.add_argument(
        "--fake-pool",
        nargs="?",
        const="sleep",
        default=None,
        choices=("sleep", "burn"),
        help="serve the fake pool at the tiny model's geometry and fitted step time instead "
        "of the tiny model (docs/gpu-pool.md, Faithfulness)",
    )
    ap.add_argument("--ice-workers", type=int, default=1, help="ICE --workers (each ICE)")
    ap.add_argument(
        "--queue-wait-ms", type=int, default=QUEUE_WAIT_MS, help="queue mode: max_queue_wait_ms"
    )
    ap.add_argument(
        "--queue-length", type=int, default=QUEUE_LENGTH, help="queue mode: max_queue_length"
    )
    ap.add_argument(
        "--queue-critical",
        choices=("pass", "wait"),
        default="pass",
        help="queue mode: the queue's critical (wait: critical requests wait for room too)",
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
        help="also run a control per arm: only this tenant's requests, same times",
    )
    ap.add_argument("--vllm-nice", type=int, default=VLLM_NICE, help="nice of vLLM (0: as is)")
    ap.add_argument("--vllm-arg", action="append", default=list(VLLM_ARGS), help="to vllm serve")
    ap.add_argument(
        "--json", type=Path, default=None, help="write the full report here (- = stdout)"
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="print the plan, arms and time estimate; run none"
    )
    args = ap.parse_args(argv)
    try:
        arms = arms_of(args)
        groups = group_arms(arms)
        own = valve_in_args(args.vllm_arg)
        if own is not None:
            raise ValueError(f"--vllm-arg {own}: give a valve as an arm (--modes valve:...)")
        burst = plan_of(args)
        if args.tenant_alone is not None and args.tenants is None:
            raise ValueError("--tenant-alone needs --tenants")
        controls = controls_of(burst, args.tenant_alone)
        if args.ice_workers < 1:
            raise ValueError("--ice-workers must be ≥ 1")
    except ValueError as e:
        ap.error(str(e))
    queue = any(a.mode == "queue" for a in arms)
    params: dict[str, Any] = {
        "workload": args.workload,
        "requests": args.requests,
        **(
            {
                "seed": args.seed,
                "mixed": MixedSpec(long_share=args.long_share).as_dict(),
                "limits": args.limits,
            }
            if args.workload == "mixed"
            else dict(zip(("prompt_filler_tokens", "max_tokens"), burst_size(args), strict=True))
        ),
        "spacing_ms": args.spacing_ms,
        "mix": args.mix,
        "policy": str(args.policy),
        "admission": args.admission,
        "tenant_shares": args.tenant_shares,
        "history": args.history,
        "forecast": {
            "quantile": args.quantile,
            "margin": args.margin,
            "start_within_s": args.start_within_s,
            "refine": args.refine,
        },
        "modes": [a.name for a in arms],
        "rounds": args.rounds,
        "ice_workers": args.ice_workers,
        "fake_pool": args.fake_pool,
        "ttft_slo_s": args.ttft_slo_s,
        "tenants": args.tenants,
        "tenant_alone": args.tenant_alone,
        "tenant_header": TENANT_HEADER,
        "vllm_args": list(args.vllm_arg),
        **(
            {
                "queue_wait_ms": args.queue_wait_ms,
                "queue_length": args.queue_length,
                "queue_critical": args.queue_critical,
            }
            if queue
            else {}
        ),
    }
    if args.dry_run:
        print(header(params, burst, groups))
        minutes = estimate_s(groups, args.rounds, burst, len(controls)) / 60
        print(f"estimate: ~{minutes:.1f} min ({len(groups)} vLLM, {len(arms)} arms)")
        return 0
    if not is_plain(args.workload, groups):
        minutes = estimate_s(groups, args.rounds, burst, len(controls)) / 60
        print(
            f"[overload] {len(arms)} arms on {len(groups)} vLLM, ~{minutes:.0f} min (estimate)",
            file=sys.stderr,
        )
    with contextlib.ExitStack() as es:
        workdir = args.workdir or Path(es.enter_context(tempfile.TemporaryDirectory()))
        policy = args.policy
        if args.admission != "policy":
            workdir.mkdir(parents=True, exist_ok=True)
            policy = admission_policy(
                policy,
                workdir / "policy-admission.yaml",
                args.admission,
                read_floors=args.limits != "client",
                forecast={
                    k: v
                    for k, v in (
                        ("quantile", args.quantile),
                        ("margin", args.margin),
                        ("start_within_s", args.start_within_s),
                        ("refine", None if args.refine is None else args.refine == "on"),
                    )
                    if v is not None
                },
                ttft_ms=args.ttft_slo_s * 1000,
            )
        if args.tenant_shares:
            workdir.mkdir(parents=True, exist_ok=True)
            shares = json.loads(args.tenant_shares)
            policy = shares_policy(policy, workdir / "policy-shares.yaml", shares)
        try:
            done = sweep(
                workdir,
                groups,
                burst,
                rounds=args.rounds,
                sample_s=args.sample_ms / 1000,
                ttft_slo_s=args.ttft_slo_s,
                controls=controls,
                vllm_args=args.vllm_arg,
                queue=queue,
                start=(
                    functools.partial(fake_pool_setup, burn=args.fake_pool == "burn")
                    if args.fake_pool
                    else overload_setup
                ),
                policy=policy,
                vllm_nice=args.vllm_nice,
                ice_workers=args.ice_workers,
                queue_wait_ms=args.queue_wait_ms,
                queue_length=args.queue_length,
                queue_critical=args.queue_critical,
                tenant_header=TENANT_HEADER,
                history=history_of(args),
            )
        except QueuePolicyError as e:
            print(f"[overload] {e}", file=sys.stderr)
            return 2
        except SweepError as e:
            print(f"[overload] {e}; printing the {len(e.done)} vLLM done", file=sys.stderr)
            emit(e.done, burst, params, groups, args.json)
            return 1
    emit(done, burst, params, groups, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
