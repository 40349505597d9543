"""Do N ICE replicas over-admit? The lab half of ``bench/replicas.py``.

Each ICE keeps its in-flight KV ledger per process (``ext_proc.placement.poolview``): behind Envoy's
round robin, N replicas each believe they own the pool's free blocks and can admit up to N
times what it holds. This package measures that, and what the remedies change:

```
burst (R at once) ─► Envoy ─ext_proc─► ICE replica 0..N-1 (--workers 1 each)
                       └──────────────────────────────────► backend (dev: 64 × 16 blocks;
                                                              vllm: the tiny model, 24 × 128)
shape local:   round robin over the replicas, each its own ledger
shape redis:   round robin, every replica `--ledger redis://...` on one Redis
shape standby: the ICE cluster in priority levels (replica 0 active, the rest standby)
```

One module per job, each stating its invariants at the top:

- ``accounting``: the pure arithmetic: a request's blocks (ICE's formula), the peak of blocks
  held at once over the admitted requests' intervals, the over-admission (peak − usable),
  quantiles, median [min–max] over rounds.
- ``traffic``: the burst, the latency probe, the steady load; ``Answer`` per request.
- ``setup``: the backend (dev or vLLM, once) and a setting's N replicas + Envoy.
- ``scenarios``: a setting's rounds and the sweep.
- ``faults``: the failover (one replica of any shape killed or hung under a steady load,
  then back) and the crash (redis: a replica killed with a full pool).
- ``readings``: what the scenarios read between steps (vLLM's preemptions, each replica's
  passes, the shared ledger's errors), the backend settled, the shared Redis flushed.
- ``report``: the plan, the markdown table, the scenarios' lines, the JSON document.
- ``dev_policy.yaml``: the policy of the dev backend's runs (``kv_hold: done``,
  ``on_kv_shortfall: shed``: a request that does not fit is a 429, never a smaller one).

Invariants: every process started here is stopped when its ``with`` block exits; a
setting's replicas and Envoy are stopped before the next setting starts; over-admission is
computed client side from each admitted request's interval and blocks, never from ICE's own
metrics; importing needs ICE's own dependencies only (vLLM runs as a subprocess of its venv).
"""

from ext_proc.lab.replicas.accounting import (
    Held,
    Stats,
    added_ms,
    blocks_for,
    nearest_rank,
    over_admission,
    peak_blocks,
    stats,
)
from ext_proc.lab.replicas.faults import CrashResult, FailoverResult, crash, failover
from ext_proc.lab.replicas.report import (
    COLUMNS,
    crash_text,
    document,
    estimate_s,
    failover_table,
    failover_text,
    plan_text,
    table,
)
from ext_proc.lab.replicas.scenarios import (
    METRICS,
    RoundResult,
    SettingResult,
    held,
    run_round,
    run_setting,
    settings,
    sweep,
)
from ext_proc.lab.replicas.setup import (
    BACKENDS,
    DEV_POLICY,
    DEV_STATE,
    SHAPES,
    Backend,
    Replicas,
    ShapeUnavailable,
    dev_backend,
    replicas_up,
    shape_available,
    vllm_backend,
)
from ext_proc.lab.replicas.traffic import (
    JUDGED_HEADER,
    Answer,
    BurstPlan,
    burst,
    probe_latency,
    prompt_text,
    steady,
)

__all__ = [
    "BACKENDS",
    "COLUMNS",
    "DEV_POLICY",
    "DEV_STATE",
    "JUDGED_HEADER",
    "METRICS",
    "SHAPES",
    "Answer",
    "Backend",
    "BurstPlan",
    "CrashResult",
    "FailoverResult",
    "Held",
    "Replicas",
    "RoundResult",
    "SettingResult",
    "ShapeUnavailable",
    "Stats",
    "added_ms",
    "blocks_for",
    "burst",
    "crash",
    "crash_text",
    "dev_backend",
    "document",
    "estimate_s",
    "failover",
    "failover_table",
    "failover_text",
    "held",
    "nearest_rank",
    "over_admission",
    "peak_blocks",
    "plan_text",
    "probe_latency",
    "prompt_text",
    "replicas_up",
    "run_round",
    "run_setting",
    "settings",
    "shape_available",
    "stats",
    "steady",
    "sweep",
    "table",
    "vllm_backend",
]
