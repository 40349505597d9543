"""One overload burst sent twice to a real vLLM: straight to it, and through Envoy + ICE.

The command line of ``ext_proc/lab/overload/`` (which does the work; ``ice demo`` uses it too).

```
burst ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
       └─ via ICE ─► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/lab/vllm_tiny_policy.yaml)
                       └───────────────────────────────► same vllm serve
```

The burst: ``--requests`` streamed chat completions of ~``--prompt-tokens`` prompt tokens and
``--max-tokens`` output tokens (``ignore_eos``), started ``--spacing-ms`` apart on a fixed
schedule (open loop: a request never waits for another to finish), priorities interleaved
from ``--mix``. The same burst (same sizes, priorities and schedule; fresh prompt text per run,
so no run reuses another's prefix cache) goes once straight to vLLM and once through Envoy +
ICE, with vLLM idle in between (running = waiting = 0). The order alternates per round.

Per request: status, latency, time to first token (or to the 429), output tokens
(``usage.completion_tokens``), ``Retry-After``, ICE's verdict headers. Per run, from vLLM's
/metrics: the ``vllm:num_preemptions_total`` delta, vLLM's mean queue time, and (sampled every
``--sample-ms``) the peak of waiting, running and KV usage. Envoy's ext_proc stats tell whether
any request went through unjudged (fail-open).

    .venv/bin/python bench/overload.py                 # 24 requests, 3 rounds, table
    .venv/bin/python bench/overload.py --rounds 1 --json out.json
    .venv/bin/python bench/overload.py --spacing-ms 0  # all at once (see below)

Needs ``.venv-vllm`` (``make vllm-install``): ~25 s to start vLLM, ~30 s a round.

Set-up choices:
- ICE's scraper runs in both modes, so vLLM serves the same /metrics load in both.
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
    MAX_TOKENS,
    MIX,
    MODES,
    POLICY,
    PROMPT_TOKENS,
    REQUESTS,
    SPACING_MS,
    VLLM_ARGS,
    VLLM_NICE,
    compare,
    overload_setup,
    plan_burst,
    report,
    table,
    totals,
)


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
    ap.add_argument("--modes", default=",".join(MODES), help="direct,ice (or one of them)")
    ap.add_argument("--vllm-nice", type=int, default=VLLM_NICE, help="nice of vLLM (0: as is)")
    ap.add_argument("--vllm-arg", action="append", default=list(VLLM_ARGS), help="to vllm serve")
    ap.add_argument(
        "--json", type=Path, default=None, help="write the full report here (- = stdout)"
    )
    args = ap.parse_args(argv)
    burst = plan_burst(
        args.requests, args.prompt_tokens, args.max_tokens, args.spacing_ms, args.mix
    )
    params = {
        "requests": args.requests,
        "prompt_filler_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "spacing_ms": args.spacing_ms,
        "mix": args.mix,
        "policy": str(args.policy),
    }
    with contextlib.ExitStack() as es:
        workdir = args.workdir or Path(es.enter_context(tempfile.TemporaryDirectory()))
        with overload_setup(
            workdir, policy=args.policy, vllm_args=args.vllm_arg, vllm_nice=args.vllm_nice
        ) as setup:
            print(f"[overload] vLLM up in {setup.vllm.startup_s:.1f} s", file=sys.stderr)
            results = compare(
                setup,
                burst,
                rounds=args.rounds,
                sample_s=args.sample_ms / 1000,
                modes=[m for m in args.modes.split(",") if m in MODES],
            )
    full = report(results, burst, params)
    if args.json is not None and str(args.json) == "-":
        print(json.dumps(full, indent=1))
        return 0
    if args.json is not None:
        args.json.write_text(json.dumps(full, indent=1) + "\n")
    print(table(results))
    print(totals(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
