"""How long a policy change takes to be in force, and what a reload costs the traffic.

    .venv/bin/python bench/reload.py [--reloads 20] [--workers 1] [--rate 50] [--json F]

The stack: the dev backend (reporting a high pressure, so that sheddable requests get a 429
with ``retry-after``), ICE with ``--workers`` and real Envoy (``envoy/envoy.yaml``). A steady
load of sheddable chats at ``--rate`` per second runs throughout. Each reload writes the policy
with another ``retry_after_s`` (write and rename, as editors and config tools do; every other
reload through SIGHUP instead of waiting for the file watch) and then probes every 10 ms until a
429 carries the new value: that is the reload latency, from the rename to the first request
judged under the new policy, through Envoy. Reported: latency p50 / p95 / max, and the load's
requests, errors, non-429 answers and unjudged answers (all should be 0 but the requests).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import throughput as tb  # noqa: E402

HIGH = {"kv_cache_usage_perc": 0.97, "num_requests_waiting": 3}
BODY = json.dumps(
    {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()
RETRY = re.compile(r"(retry_after(?:_min|_max)?_s): \S+")


def post(port: int) -> tuple[int, str | None, str | None]:
    """One sheddable chat: (status, retry-after, x-ice-decision); status 0 on a failure."""
    headers = {"content-type": "application/json", "x-priority": "sheddable"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", BODY, headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status, r.headers.get("retry-after"), r.headers.get("x-ice-decision")
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, e.headers.get("retry-after"), e.headers.get("x-ice-decision")
    except OSError:
        return 0, None, None


def write_retry(policy: Path, value: int) -> None:
    tmp = policy.with_name("policy.tmp")
    tmp.write_text(RETRY.sub(rf"\g<1>: {value}", policy.read_text()))
    os.replace(tmp, policy)


def main(argv: list[str] | None = None) -> int:
    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reloads", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ice-reload-") as tmp, Stack(Path(tmp)) as stack:
        backend, ingress, admin = free_port(), free_port(), free_port()
        ice = tb.free_ports(args.workers)
        backend_url = stack.start_backend(backend)
        policy = tb.write_policy(Path(tmp), f"{backend_url}/metrics")
        text = policy.read_text().replace(
            "    retry_after_s: 2\n",
            "    retry_after_s: 2\n    retry_after_min_s: 2\n    retry_after_max_s: 2\n",
        )
        policy.write_text(text)
        addresses = stack.start_ice(f"127.0.0.1:{ice}", policy=policy, workers=args.workers)
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": ingress},
            clusters={"ice": addresses, "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        put = urllib.request.Request(
            f"{backend_url}/_dev/state", json.dumps(HIGH).encode(), method="PUT"
        )
        urllib.request.urlopen(put, timeout=5).read()
        while post(ingress)[1] != "2":
            time.sleep(0.05)

        outcomes: list[tuple[int, str | None, str | None]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                started = time.monotonic()
                outcomes.append(post(ingress))
                time.sleep(max(0.0, 1 / args.rate - (time.monotonic() - started)))

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        latencies: list[float] = []
        ice_pid = stack.procs["ice"].pid
        for i in range(args.reloads):
            value = 3 + i  # a new value every time: each reload is a real change
            changed = time.monotonic()
            write_retry(policy, value)
            if i % 2:
                os.kill(ice_pid, signal.SIGHUP)
            while post(ingress)[1] != str(value):
                assert time.monotonic() - changed < 10, f"reload {i} never took effect"
                time.sleep(0.01)
            latencies.append(time.monotonic() - changed)
            time.sleep(0.5)
        stop.set()
        thread.join(15)
    latencies.sort()
    result = {
        "workers": args.workers,
        "reloads": len(latencies),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3),
        "latency_max_s": round(latencies[-1], 3),
        "load_requests": len(outcomes),
        "load_errors": sum(1 for s, _, _ in outcomes if s == 0),
        "load_not_429": sum(1 for s, _, _ in outcomes if s not in (0, 429)),
        "load_unjudged": sum(1 for s, _, d in outcomes if s and d is None),
    }
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
