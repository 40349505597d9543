"""How fast ``admission: slo`` answers a request that cannot make its target, through Envoy.

    .venv/bin/python bench/slo_refusal.py [--requests 300] [--json F]

The stack: the dev backend serving a verbatim vLLM page whose scrapes show a prefill speed
(``ext_proc.lab.slo_page``: r = 100 tokens a second, 40 requests waiting, so a new request's
predicted time to first token is about 20 s), ICE with the built-in policy under
``admission: slo`` with a 2 s TTFT target, and real Envoy (``envoy/envoy.yaml``). One client
sends ``--requests`` chats one after another and times each from the request to the end of the
answer: every one should be a 429 ``slo_unreachable``. Then the page shows no queue and a
prefill speed of 10,000 tokens a second, and as many chats go through to the dev backend: the
same path with a pass, for comparison (at 100 tokens a second the prompts ICE itself sent
since the last scrape, ``ahead``, would soon add up past the target, as they should).
Reported: p50 / p99 / max of each, in ms, and the answers that were not what the arm
expects, by status:reason. The issue's target: ``slo_unreachable`` in under 5 ms at the
99th percentile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
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

BODY = json.dumps(
    {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()


def post(port: int) -> tuple[int, str | None, float]:
    """One chat: (status, x-ice-reason, seconds to the end of its answer); status 0: failed."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        BODY,
        {"content-type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            status, reason = r.status, r.headers.get("x-ice-reason")
    except urllib.error.HTTPError as e:
        e.read()
        status, reason = e.code, e.headers.get("x-ice-reason")
    except OSError:
        status, reason = 0, None
    return status, reason, time.perf_counter() - started


def put_page(backend_url: str, page: bytes) -> None:
    req = urllib.request.Request(f"{backend_url}/_dev/metrics", page, method="PUT")
    urllib.request.urlopen(req, timeout=5).read()


def summary(times_s: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times_s)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "max_ms": round(ms[-1], 2),
    }


def run_arm(port: int, n: int, want: tuple[int, str | None]) -> tuple[list[float], dict[str, int]]:
    """The times of the answers that were ``want``; the others counted by status:reason."""
    times: list[float] = []
    other: dict[str, int] = {}
    for _ in range(n):
        status, reason, took = post(port)
        if (status, reason) == want:
            times.append(took)
        else:
            key = f"{status}:{reason}"
            other[key] = other.get(key, 0) + 1
    return times, other


def main(argv: list[str] | None = None) -> int:
    import yaml

    from ext_proc.lab.slo_page import speed_page
    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ice-slo-") as tmp, Stack(Path(tmp)) as stack:
        backend, ingress, admin = free_port(), free_port(), free_port()
        ice = tb.free_ports(1)
        backend_url = stack.start_backend(backend)
        policy = tb.write_policy(Path(tmp), f"{backend_url}/metrics")
        doc = yaml.safe_load(policy.read_text())
        for profile in doc["profiles"].values():
            profile["admission"] = "slo"
            profile["slo"] = {"ttft_ms": 2000}
        for pool in doc["pools"].values():
            pool["window_s"] = 600  # the one interval with a prefill stays in the window
        policy.write_text(yaml.safe_dump(doc, sort_keys=False))
        addresses = stack.start_ice(f"127.0.0.1:{ice}", policy=policy)
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": ingress},
            clusters={"ice": addresses, "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        put_page(backend_url, speed_page(1, 40))
        time.sleep(1.0)
        put_page(backend_url, speed_page(2, 40))
        deadline = time.monotonic() + 20
        while post(ingress)[1] != "slo_unreachable":
            assert time.monotonic() < deadline, "ICE never judged by the prefill speed"
            time.sleep(0.1)
        refused, refused_other = run_arm(ingress, args.requests, (429, "slo_unreachable"))
        # no queue, and a prefill speed of 10,000 tokens a second: what ICE itself sends
        # since each scrape (``ahead``) stays far within the target
        put_page(backend_url, speed_page(1, 0, tokens=5000.0))
        time.sleep(1.0)
        put_page(backend_url, speed_page(2, 0, tokens=5000.0))
        deadline = time.monotonic() + 20
        while post(ingress)[0] != 200:
            assert time.monotonic() < deadline, "the drained queue never let a request pass"
            time.sleep(0.1)
        passed, passed_other = run_arm(ingress, args.requests, (200, None))
    result = {
        "requests": args.requests,
        "slo_unreachable": {**summary(refused), "other_answers": refused_other},
        "pass": {**summary(passed), "other_answers": passed_other},
    }
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
