"""One overload burst against a real vLLM: straight to it, through Envoy + ICE, through
Envoy + an ICE that queues, and against vLLM's own admission valve.

```
burst ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
       ├─ ice ───► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/lab/vllm_tiny_policy.yaml)
       │             └─────────────────────────────────► same vllm serve
       └─ queue ─► 2nd Envoy ─ext_proc─► 2nd ICE (same policy + `queue:` in every profile)
                     └─────────────────────────────────► same vllm serve
 then, per valve setting, the same with a vllm serve --max-num-queued-reqs N (or -tokens T):
       valve:reqs=N (direct), ice+valve:reqs=N, queue+valve:reqs=N
```

Job: the reusable half of ``bench/overload.py`` (its command line), also used by ``ice demo``
(the vLLM walkthrough) and ``tests/e2e/test_vllm_overload.py``:

- ``overload_setup``: start ``vllm serve`` (``ext_proc.lab.vllm_local``: CPU, the tiny model,
  24 KV blocks of 128 tokens), ICE with a policy (default ``POLICY``, rendered to scrape that
  vLLM and to count tokens with its tokenizer) and real Envoy in front; with ``queue=True``
  also a second ICE whose policy is ``queue_policy`` of it (the admission queue on in every
  profile: a request ICE would refuse for ``memory_pressure`` or ``kv_exhausted`` waits for
  room, then passes with ``x-ice-queued-ms``, or gets 429 ``queue_timeout`` / ``queue_full``)
  behind a second Envoy; ``ice_workers``: each ICE's ``--workers``; free ports unless given;
  yields a ``Setup``.
- ``plan_burst`` / ``run_burst`` / ``compare``: an open-loop burst (each request starts at its
  planned time, never waiting for another), priorities and (optionally) tenants interleaved
  by weight, the tenant sent as ``x-tenant``; the same burst in each mode (``MODES``: direct,
  ice, queue; ``DEFAULT_MODES``: direct, ice), the order rotated per round; ``alone`` (a
  tenant's requests only, same times) for control runs (``compare(controls=...)``).
- ``arms`` / ``sweep``: an arm is a mode and the valve of its vLLM (``valve:reqs=4``,
  ``ice+valve:tokens=2048``; ``parse_arms``, ``sweep_arms``); ``group_arms`` groups the arms
  by the vLLM they need and ``sweep`` starts one stack per group and runs ``compare`` there.
- ``plan_mixed`` (``workload``): the mixed workload (70 % short, 30 % long prompts, heavy-
  tailed outputs, seeded), beside ``plan_burst``.
- ``RunResult.summary``, ``table``, ``totals``, ``tenant_table``, ``kind_table``, ``report``:
  per-run numbers (vLLM's preemption delta and queue time, 429s by reason, 503s by valve and
  vLLM's admission-rejection delta, other answers by status, requests
  ICE queued and how long, TTFT and end-to-end latency quantiles of the 200s, drain time,
  tokens per second and goodput, sampled peaks of waiting / running / KV usage, Envoy's
  fail-open count, a per-tenant breakdown), their side-by-side table, one row per mode with
  the spread over rounds (``median [min–max]``), and the JSON report of everything per run.

Goodput = Σ completion tokens of the 200s whose time to first token was ≤ the SLO
(``TTFT_SLO_S`` = 2.0 s unless given) / drain time (from the burst's start, t0, to the end of
its last request, 429s included).

One module per job, each stating its invariants at the top:

- ``burst``: the defaults, the plan of a burst (priorities, tenants) and each request's body.
- ``workload``: the mixed workload's plan and its parameters (``MixedSpec``).
- ``arms``: arms, valves and their grouping by vLLM config.
- ``metrics``: readings of vLLM's ``/metrics``, ICE's histogram and Envoy's counters.
- ``run``: one run of a burst against one target (``send``, ``RunResult``, ``run_burst``).
- ``shots``: what each request got (``Shot``) and the pure reductions of a run's shots
  (``drain_s``, ``goodput``, ``by_reason``, ``by_status``, ``tenant_breakdown``).
- ``setup``: vLLM + ICE(s) + Envoy(s) started and stopped together; ``compare`` runs the modes.
- ``sweep``: one setup and one ``compare`` per vLLM config, one after the other.
- ``results``: the one-line, table, spread, per-tenant and JSON views of finished runs.

Invariants:

- every process ``overload_setup`` starts (vLLM's whole process group, the ICEs, the Envoys)
  is stopped when its ``with`` block exits, on error and on Ctrl-C too;
- without ``queue=True`` no queue policy is written, loaded or started, so direct and ice run
  on an ICE that does not know the ``queue`` key; with it, a policy that does not load raises
  ``QueuePolicyError`` before vLLM starts;
- each run of ``compare`` starts with vLLM idle (nothing running or waiting on two samples in
  a row) and uses fresh prompt text (seeded per round, mode and control), so no run inherits
  another's queue or prefix cache; the plan (sizes, priorities, tenants, schedule) is the
  same for every mode; in a sweep one vLLM runs at a time, and every run's label names the
  valve its vLLM was started with;
- a ``Shot`` never raises: a transport error is recorded in ``Shot.error``;
- importing needs only ICE's own dependencies: vLLM runs in its own venv as a subprocess.
"""

from ext_proc.lab.overload.arms import (
    Arm,
    Valve,
    VllmGroup,
    arm_name,
    group_arms,
    parse_arm,
    parse_arms,
    parse_limits,
    sweep_arms,
    valve_in_args,
    valve_reason,
)
from ext_proc.lab.overload.burst import (
    CHAT,
    DEFAULT_MODES,
    MAX_TOKENS,
    MIX,
    MODES,
    POLICY,
    PRIORITIES,
    PROMPT_TOKENS,
    REQUESTS,
    SPACING_MS,
    TENANT_HEADER,
    TTFT_SLO_S,
    VLLM_ARGS,
    VLLM_NICE,
    Planned,
    alone,
    interleave,
    parse_mix,
    parse_tenants,
    plan_burst,
    request_body,
)
from ext_proc.lab.overload.metrics import (
    Sample,
    admission_rejections,
    bucket_quantile,
    ext_proc_stats,
    fetch,
    ice_body_buckets,
    metric_sum,
    wait_idle,
)
from ext_proc.lab.overload.policies import shares_policy
from ext_proc.lab.overload.results import (
    KIND_COLS,
    ROWS,
    SPREAD_COLS,
    TENANT_COLS,
    kind_table,
    one_line,
    report,
    spread,
    spreads,
    table,
    tenant_table,
    totals,
)
from ext_proc.lab.overload.run import RunResult, run_burst
from ext_proc.lab.overload.setup import (
    MAX_TENANTS,
    QUEUE_LENGTH,
    QUEUE_WAIT_MS,
    QueuePolicyError,
    Setup,
    admission_policy,
    compare,
    overload_setup,
    queue_policy,
    render_policy,
    warm_up,
)
from ext_proc.lab.overload.shots import (
    Shot,
    by_reason,
    by_status,
    by_valve,
    drain_s,
    goodput,
    kind_breakdown,
    quantile,
    tenant_breakdown,
)
from ext_proc.lab.overload.sweep import (
    GroupRun,
    SweepError,
    estimate_s,
    group_workdir,
    sweep,
)
from ext_proc.lab.overload.workload import (
    CLIENT_LIMIT,
    LIMITS,
    WORKLOADS,
    LogNormal,
    MixedSpec,
    describe,
    plan_mixed,
    plan_text,
)

__all__ = [
    "CHAT",
    "CLIENT_LIMIT",
    "DEFAULT_MODES",
    "KIND_COLS",
    "LIMITS",
    "MAX_TENANTS",
    "MAX_TOKENS",
    "MIX",
    "MODES",
    "POLICY",
    "PRIORITIES",
    "PROMPT_TOKENS",
    "QUEUE_LENGTH",
    "QUEUE_WAIT_MS",
    "REQUESTS",
    "ROWS",
    "SPACING_MS",
    "SPREAD_COLS",
    "TENANT_COLS",
    "TENANT_HEADER",
    "TTFT_SLO_S",
    "VLLM_ARGS",
    "VLLM_NICE",
    "WORKLOADS",
    "Arm",
    "GroupRun",
    "LogNormal",
    "MixedSpec",
    "Planned",
    "QueuePolicyError",
    "RunResult",
    "Sample",
    "Setup",
    "Shot",
    "SweepError",
    "Valve",
    "VllmGroup",
    "admission_policy",
    "admission_rejections",
    "alone",
    "arm_name",
    "bucket_quantile",
    "by_reason",
    "by_status",
    "by_valve",
    "compare",
    "describe",
    "drain_s",
    "estimate_s",
    "ext_proc_stats",
    "fetch",
    "goodput",
    "group_arms",
    "group_workdir",
    "ice_body_buckets",
    "interleave",
    "kind_breakdown",
    "kind_table",
    "metric_sum",
    "one_line",
    "overload_setup",
    "parse_arm",
    "parse_arms",
    "parse_limits",
    "parse_mix",
    "parse_tenants",
    "plan_burst",
    "plan_mixed",
    "plan_text",
    "quantile",
    "queue_policy",
    "render_policy",
    "report",
    "request_body",
    "run_burst",
    "shares_policy",
    "spread",
    "spreads",
    "sweep",
    "sweep_arms",
    "table",
    "tenant_breakdown",
    "tenant_table",
    "totals",
    "valve_in_args",
    "valve_reason",
    "wait_idle",
    "warm_up",
]
