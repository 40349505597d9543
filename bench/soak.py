"""Hours of mixed traffic in minutes: does ICE's memory, file descriptors or latency creep?

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 60] [--sample-s 60] [--json F]

The stack: the dev backend, ICE with two workers (so that one can be killed and replaced),
real Envoy (``envoy/envoy.yaml``). A steady load of ``--rate`` requests per second, mixed:
passes, downgrades (``max_tokens`` over the context), 400s (broken JSON), 415s
(``text/plain``), sheddable requests (429 while the pool is high or critical; every request
at critical), long conversations (truncated semantically while it is high), streaming and
Anthropic requests. The pool's metrics go calm, high, calm, critical, 20 s each; at a
third of the run the backend is restarted, at two thirds one ICE worker is killed (SIGKILL;
the supervisor starts a new one).

Every ``--sample-s`` it samples ICE's process tree (RSS, open file descriptors, threads) and
the p50 / p99 latency of the window's requests. A request outside the kill and restart
windows (5 s each) that comes back without ``x-ice-decision`` is unjudged. Targets, after
the first 5 minutes: RSS and fds grow < 5 %, p99 does not drift up more than 10 %, nothing
unjudged. ``run`` is what ``tests/e2e/test_soak.py`` calls for 60 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import throughput as tb  # noqa: E402  (the /proc helpers)

# The pool's states, with the built-in policy's weights (kv 0.40, queue 0.25, saturation 8):
# score = 100 × (0.40 × usage + 0.25 × min(1, waiting / 8)) / 0.65.
CALM = {"kv_cache_usage_perc": 0.2, "num_requests_waiting": 0}  # 12: low
HIGH = {"kv_cache_usage_perc": 0.97, "num_requests_waiting": 3}  # 74: high
CRITICAL = {"kv_cache_usage_perc": 1.0, "num_requests_waiting": 12}  # 100: critical
FLAPS = (CALM, HIGH, CALM, CRITICAL)  # one state per FLAP_S
FLAP_S = 20.0
# Semantic truncation on the default profile: the "long" conversations of the mix (about 700
# tokens) are cut to these budgets while the pool is high (at critical they are shed first).
TRUNCATION = {
    "enabled": True,
    "budget_tokens": {"high": 300, "critical": 200},
    "keep_last_turns": 1,
    "deadline_ms": 2000,
    "on_overflow": "best_effort",
}
TOPICS = ("basil", "git", "kyoto", "ira", "sourdough", "squats", "python", "plants", "faucet")
EVENT_WINDOW_S = 5.0


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    fds: int
    threads: int
    requests: int
    p50_ms: float
    p99_ms: float


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    sent: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    by_decision: dict[str, int] = field(default_factory=dict)  # x-ice-decision of the answers
    flap_failures: int = 0  # state changes the backend refused (outside its restart)
    unjudged: int = 0
    unjudged_in_windows: int = 0
    errors: int = 0


def fds(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return total


def threads(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def request_kinds(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    """One request of the mix: (path, body, headers)."""
    chat = "/v1/chat/completions"
    words = " ".join(rng.choice(["memory", "cache", "token", "block"]) for _ in range(30))
    msgs = [{"role": "user", "content": words}]
    kind = rng.choice(
        ["pass", "pass", "downgrade", "bad", "text", "shed", "stream", "anthropic", "long"]
    )
    json_type = {"content-type": "application/json"}
    if kind == "long":  # ten turns of about 35 words on unrelated topics, then a question
        history: list[dict[str, str]] = []
        for topic in TOPICS:
            said = " ".join(rng.choice(["why", "how", "when", topic]) for _ in range(35))
            history += [{"role": "user", "content": said}, {"role": "assistant", "content": said}]
        history.append({"role": "user", "content": f"Back to {rng.choice(TOPICS)}: {words}"})
        body = {"model": "dev-model", "messages": history, "max_tokens": 32}
        return chat, json.dumps(body).encode(), json_type
    if kind == "pass":
        return (
            chat,
            json.dumps({"model": "dev-model", "messages": msgs, "max_tokens": 32}).encode(),
            json_type,
        )
    if kind == "downgrade":
        return (
            chat,
            json.dumps({"model": "dev-model", "messages": msgs, "max_tokens": 99_999}).encode(),
            json_type,
        )
    if kind == "bad":
        return chat, b'{"model": "dev-model", "messages": [', json_type
    if kind == "text":
        return chat, b"hello", {"content-type": "text/plain"}
    if kind == "shed":
        body = json.dumps({"model": "dev-model", "messages": msgs, "max_tokens": 16}).encode()
        return chat, body, {**json_type, "x-priority": "sheddable"}
    if kind == "stream":
        body = {"model": "dev-model", "messages": msgs, "max_tokens": 16, "stream": True}
        return chat, json.dumps(body).encode(), json_type
    body = {"model": "dev-model", "max_tokens": 16, "messages": msgs}
    return "/v1/messages", json.dumps(body).encode(), json_type


def run(
    port: int,
    backend_url: str,
    ice_pid: int,
    seconds: float,
    rate: float,
    sample_s: float,
    restart_backend: object = None,
    kill_worker: object = None,
) -> SoakResult:
    """Drive the mix for ``seconds``; ``restart_backend`` / ``kill_worker``: callables run
    at a third and two thirds of the run."""
    result = SoakResult()
    lock = threading.Lock()
    latencies: list[float] = []
    windows: list[tuple[float, float]] = []
    rng = random.Random(1)
    started = time.monotonic()

    def one(path: str, body: bytes, headers: dict[str, str]) -> None:
        t0 = time.monotonic()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers)
        status, decision = 0, None
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                status, decision = r.status, r.headers.get("x-ice-decision")
        except urllib.error.HTTPError as e:
            e.read()
            status, decision = e.code, e.headers.get("x-ice-decision")
        except OSError:
            status = 0
        judged = decision is not None
        dt = time.monotonic() - t0
        in_window = any(a <= t0 - started <= b for a, b in windows)
        with lock:
            result.sent += 1
            key = str(status)
            result.by_status[key] = result.by_status.get(key, 0) + 1
            if decision is not None:
                result.by_decision[decision] = result.by_decision.get(decision, 0) + 1
            latencies.append(dt * 1e3)
            if status == 0:
                result.errors += 1
            elif not judged:
                if in_window:
                    result.unjudged_in_windows += 1
                else:
                    result.unjudged += 1

    def flap() -> None:
        flips = 0
        while (now := time.monotonic() - started) < seconds:
            data = json.dumps(FLAPS[flips % len(FLAPS)]).encode()
            put = urllib.request.Request(f"{backend_url}/_dev/state", data=data, method="PUT")
            try:
                urllib.request.urlopen(put, timeout=5).read()
            except OSError:  # refused (a bad state) or the backend restarting
                if not any(a <= now <= b for a, b in windows):
                    result.flap_failures += 1
            flips += 1
            time.sleep(FLAP_S)

    events = [(seconds / 3, restart_backend), (2 * seconds / 3, kill_worker)]
    threading.Thread(target=flap, daemon=True).start()
    next_sample = sample_s
    interval = 1.0 / rate
    with ThreadPoolExecutor(16) as pool:
        tick = 0
        while (now := time.monotonic() - started) < seconds:
            for at, action in list(events):
                if now >= at and action is not None:
                    events.remove((at, action))
                    windows.append((now, now + EVENT_WINDOW_S))
                    threading.Thread(target=action, daemon=True).start()  # type: ignore[arg-type]
            pool.submit(one, *request_kinds(rng))
            tick += 1
            if now >= next_sample:
                with lock:
                    window, latencies[:] = sorted(latencies), []
                pids = tb.process_tree(ice_pid)
                result.samples.append(
                    Sample(
                        t_s=round(now, 1),
                        rss_mib=round(sum(tb.rss_kib(p) for p in pids) / 1024, 1),
                        fds=fds(pids),
                        threads=threads(pids),
                        requests=len(window),
                        p50_ms=round(statistics.median(window), 2) if window else 0.0,
                        p99_ms=round(window[int(0.99 * (len(window) - 1))], 2) if window else 0.0,
                    )
                )
                next_sample += sample_s
            time.sleep(max(0.0, started + tick * interval - time.monotonic()))
    return result


def growth(samples: list[Sample], after_s: float) -> dict[str, float]:
    """Relative growth of RSS, fds and p99 from the first sample after ``after_s`` to the
    last."""
    steady = [s for s in samples if s.t_s >= after_s] or samples
    first, last = steady[0], steady[-1]

    def rel(a: float, b: float) -> float:
        return (b - a) / a if a else 0.0

    return {
        "rss": rel(first.rss_mib, last.rss_mib),
        "fds": rel(first.fds, last.fds),
        "p99": rel(
            statistics.median(s.p99_ms for s in steady[:3]),
            statistics.median(s.p99_ms for s in steady[-3:]),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=60)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ice-soak-") as tmp, Stack(Path(tmp)) as stack:
        backend, ice, ingress, admin = free_port(), tb.free_ports(2), free_port(), free_port()
        backend_url = stack.start_backend(backend)
        policy = tb.write_policy(Path(tmp), f"{backend_url}/metrics")
        doc = yaml.safe_load(policy.read_text())
        doc["profiles"]["default"]["truncation"] = TRUNCATION
        policy.write_text(yaml.safe_dump(doc, sort_keys=False))
        addresses = stack.start_ice(f"127.0.0.1:{ice}", policy=policy, workers=2)
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": ingress},
            clusters={"ice": addresses, "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        time.sleep(2)
        ice_pid = stack.procs["ice"].pid

        def restart_backend() -> None:
            stack.stop("backend")
            stack.start_backend(backend)

        def kill_worker() -> None:
            children = [
                int(c)
                for task in Path(f"/proc/{ice_pid}/task").glob("*")
                for c in (task / "children").read_text().split()
            ]  # the supervisor's own children: its workers (helpers are theirs)
            workers = [p for p in children if tb.role(p, ice_pid) == "worker"]
            if workers:
                os.kill(workers[-1], signal.SIGKILL)

        result = run(
            ingress,
            backend_url,
            ice_pid,
            args.minutes * 60,
            args.rate,
            args.sample_s,
            restart_backend,
            kill_worker,
        )
        for s in result.samples:
            print(
                f"{s.t_s:7.0f} s  RSS {s.rss_mib:6.1f} MiB  fds {s.fds:4d}  threads {s.threads:3d}"
                f"  {s.requests:6d} requests  p50 {s.p50_ms:6.2f} ms  p99 {s.p99_ms:7.2f} ms"
            )
        g = growth(result.samples, min(300.0, args.minutes * 60 / 6))
        print(
            f"sent {result.sent:,}; by status {result.by_status}; by decision "
            f"{result.by_decision}; unjudged {result.unjudged} "
            f"(+{result.unjudged_in_windows} in the kill/restart windows); errors "
            f"{result.errors}; flap failures {result.flap_failures}; growth after warm-up: "
            f"RSS {g['rss']:+.1%}, fds {g['fds']:+.1%}, p99 {g['p99']:+.1%}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps({**asdict(result), "growth": g}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
