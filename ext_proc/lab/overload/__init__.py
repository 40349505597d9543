"""One overload burst against a real vLLM, sent straight to it and through Envoy + ICE.

```
burst ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
       └─ via ICE ─► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/lab/vllm_tiny_policy.yaml)
                       └───────────────────────────────► same vllm serve
```

Job: the reusable half of ``bench/overload.py`` (its command line), also used by ``ice demo``
(the vLLM walkthrough) and ``tests/e2e/test_vllm_overload.py``:

- ``overload_setup``: start ``vllm serve`` (``ext_proc.lab.vllm_local``: CPU, the tiny model,
  24 KV blocks of 128 tokens), ICE with a policy (default ``POLICY``, rendered to scrape that
  vLLM and to count tokens with its tokenizer) and real Envoy in front; free ports unless
  given; yields a ``Setup``.
- ``plan_burst`` / ``run_burst`` / ``compare``: an open-loop burst (each request starts at its
  planned time, never waiting for another), priorities interleaved by weight; the same burst
  once straight to vLLM and once through Envoy + ICE.
- ``RunResult.summary``, ``table``, ``totals``, ``report``: per-run numbers (vLLM's
  preemption delta and queue time, 429s, latencies, sampled peaks of waiting / running / KV
  usage, Envoy's fail-open count) and their side-by-side table.

One module per job, each stating its invariants at the top:

- ``burst``: the defaults, the plan of a burst and each request's body.
- ``metrics``: readings of vLLM's ``/metrics``, ICE's histogram and Envoy's counters.
- ``run``: one run of a burst against one target (``Shot``, ``RunResult``, ``run_burst``).
- ``setup``: vLLM + ICE + Envoy started and stopped together; ``compare`` runs both modes.
- ``results``: the one-line, table, totals and JSON views of finished runs.

Invariants:

- every process ``overload_setup`` starts (vLLM's whole process group, ICE, Envoy) is stopped
  when its ``with`` block exits, on error and on Ctrl-C too;
- each run of ``compare`` starts with vLLM idle (nothing running or waiting on two samples in
  a row) and uses fresh prompt text (seeded per round and mode), so no run inherits another's
  queue or prefix cache; the plan (sizes, priorities, schedule) is the same for both modes;
- a ``Shot`` never raises: a transport error is recorded in ``Shot.error``;
- importing needs only ICE's own dependencies: vLLM runs in its own venv as a subprocess.
"""

from ext_proc.lab.overload.burst import (
    CHAT,
    MAX_TOKENS,
    MIX,
    MODES,
    POLICY,
    PRIORITIES,
    PROMPT_TOKENS,
    REQUESTS,
    SPACING_MS,
    VLLM_ARGS,
    VLLM_NICE,
    Planned,
    interleave,
    parse_mix,
    plan_burst,
    request_body,
)
from ext_proc.lab.overload.metrics import (
    Sample,
    bucket_quantile,
    ext_proc_stats,
    fetch,
    ice_body_buckets,
    metric_sum,
    wait_idle,
)
from ext_proc.lab.overload.results import ROWS, one_line, report, table, totals
from ext_proc.lab.overload.run import RunResult, Shot, run_burst
from ext_proc.lab.overload.setup import Setup, compare, overload_setup, render_policy, warm_up

__all__ = [
    "CHAT",
    "MAX_TOKENS",
    "MIX",
    "MODES",
    "POLICY",
    "PRIORITIES",
    "PROMPT_TOKENS",
    "REQUESTS",
    "ROWS",
    "SPACING_MS",
    "VLLM_ARGS",
    "VLLM_NICE",
    "Planned",
    "RunResult",
    "Sample",
    "Setup",
    "Shot",
    "bucket_quantile",
    "compare",
    "ext_proc_stats",
    "fetch",
    "ice_body_buckets",
    "interleave",
    "metric_sum",
    "one_line",
    "overload_setup",
    "parse_mix",
    "plan_burst",
    "render_policy",
    "report",
    "request_body",
    "run_burst",
    "table",
    "totals",
    "wait_idle",
    "warm_up",
]
