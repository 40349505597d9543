"""Mutated requests through real Envoy, ICE and the dev backend: nothing crashes, hangs, alters.

    .venv/bin/python bench/fuzz.py [--bodies 100000] [--seed 1] [--concurrency 8] [--json F]

Job: from valid chat, completions and Anthropic messages bodies, make seeded mutations —
wrong types, huge numbers (1e30, 10^30), NaN / Infinity literals, nesting 20,000 deep, a
BOM, invalid UTF-8, cut-off JSON, repeated keys, six content types, bodies over the 8 MiB
limit (declared and sent), chunked bodies, odd paths and methods — and send each through the
stack (one ICE worker, ``envoy/envoy.yaml``, the dev backend). Every request carries
``x-fuzz-id``; the dev backend records what reached it. Reported by outcome: passed
(the backend's 200 with the body byte for byte as sent), mutated (ICE rewrote it: the body
the backend got is JSON and differs from the sent one only in the output-limit fields),
4xx by status and ``x-ice-reason`` (Envoy's own: ``envoy``), 5xx by who sent it, requests
over 5 s, and ICE's crashes (its process gone or restarted). Targets: 0 crashes, 0 hangs,
0 altered passed bodies, 0 5xx from ICE.

``run`` is what ``tests/e2e/test_fuzz.py`` calls with 2,000 bodies on the e2e stack.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import random
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
SLOW_S = 5.0
BIG = 9 * 1024 * 1024  # over the 8 MiB body limit
CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/vnd.api+json",
)
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages")


@dataclass
class Case:
    id: int
    family: str
    method: str
    path: str
    content_type: str | None
    body: bytes
    chunked: bool = False


def _base(rng: random.Random, path: str) -> dict[str, Any]:
    text = " ".join(
        rng.choice(["memory", "cache", "block", "token", "why", "é", "内存"])
        for _ in range(rng.randint(1, 40))
    )
    limit = rng.choice([1, 16, 256, 4096, 100_000])
    if path == "/v1/completions":
        return {"model": "dev-model", "prompt": text, "max_tokens": limit}
    messages = [{"role": "user", "content": text}]
    if path == "/v1/messages":
        return {"model": "dev-model", "messages": messages, "max_tokens": limit}
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Be brief."})
    return {"model": "dev-model", "messages": messages, "max_tokens": limit}


def _odd_value(rng: random.Random) -> Any:
    return rng.choice(["lots", -3, 1.5, True, None, [], {}, [1, 2], {"a": 1}, 10**30, "", "∞"])


def mutations(count: int, seed: int) -> Iterator[Case]:
    """``count`` seeded cases (see the module docstring for the families)."""
    rng = random.Random(seed)
    families = (
        "valid", "wrong_type", "huge_number", "nan", "deep", "bom", "bad_utf8", "cut",
        "repeated_key", "content_type", "oversized", "chunked", "odd_path", "odd_method",
    )  # fmt: skip
    for i in range(count):
        family = families[i % len(families)]
        path = rng.choice(PATHS)
        doc = _base(rng, path)
        method, ctype, chunked = "POST", "application/json", False
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
        if family == "wrong_type":
            key = rng.choice([*doc.keys(), "n", "stream", "messages"])
            doc[key] = _odd_value(rng)
            text = json.dumps(doc)
        elif family == "huge_number":
            text = text.replace(
                f'"max_tokens": {doc["max_tokens"]}',
                '"max_tokens": ' + rng.choice(["1e30", "10" + "0" * 30, "-1e30", "1.0", "9" * 400]),
            )
        elif family == "nan":
            text = text.replace(
                f'"max_tokens": {doc["max_tokens"]}',
                '"max_tokens": ' + rng.choice(["NaN", "Infinity", "-Infinity"]),
            )
        elif family == "deep":
            depth = rng.choice([100, 1000, 20_000])
            text = text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
        elif family == "bom":
            text = "\ufeff" + text
        elif family == "cut":
            text = text[: rng.randint(0, max(0, len(text) - 1))]
        elif family == "repeated_key":
            text = text[:-1] + f', "max_tokens": {rng.choice([1, 10**6, "null"])}' + "}"
        elif family == "content_type":
            ctype = rng.choice(CONTENT_TYPES)
        elif family == "oversized":
            text = text[:-1] + ', "pad": "' + "x" * BIG + '"}'
        elif family == "chunked":
            chunked = True
        elif family == "odd_path":
            path = rng.choice(
                [
                    "/v1/chat",
                    "/v1/chat/completions/",
                    "//v1//completions",
                    "/v1/models",
                    "/admin",
                    "/v1/embeddings/x",
                    "/%2e%2e/v1/completions",
                ]
            )
        elif family == "odd_method":
            method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
        body = text.encode("utf-8", "surrogatepass")
        if family == "bad_utf8":
            cut = rng.randint(0, len(body))
            body = (
                body[:cut]
                + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])
                + body[cut:]
            )
        if family != "content_type" and rng.random() < 0.1:
            ctype = None  # many clients send none: judged as JSON
        yield Case(i, family, method, path, ctype, body, chunked)


@dataclass
class Sent:
    case: Case
    status: int
    headers: dict[str, str]
    seconds: float
    error: str = ""


def send(port: int, case: Case, timeout_s: float = 30) -> Sent:
    headers = {"x-fuzz-id": str(case.id)}
    if case.content_type is not None:
        headers["content-type"] = case.content_type
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        if case.chunked:
            conn.request(
                case.method, case.path, body=iter([case.body]), headers=headers, encode_chunked=True
            )
        else:
            conn.request(case.method, case.path, body=case.body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        got = {k.lower(): v for k, v in resp.getheaders()}
        return Sent(case, resp.status, got, time.perf_counter() - started)
    except (OSError, http.client.HTTPException) as e:
        return Sent(case, 0, {}, time.perf_counter() - started, type(e).__name__)
    finally:
        conn.close()


def recorded(backend_url: str) -> dict[int, bytes]:
    """The bodies the dev backend received, by ``x-fuzz-id``; then cleared."""
    with urllib.request.urlopen(f"{backend_url}/_dev/requests", timeout=30) as r:
        items = json.loads(r.read())
    out = {}
    for item in items:
        ids = [v for k, v in item["headers"] if k.lower() == "x-fuzz-id"]
        if ids:
            out[int(ids[0])] = base64.b64decode(item["body_b64"])
    req = urllib.request.Request(f"{backend_url}/_dev/requests", method="DELETE")
    urllib.request.urlopen(req, timeout=30).read()
    return out


def only_limits_differ(sent: bytes, got: bytes) -> bool:
    try:
        a, b = json.loads(sent), json.loads(got)
    except ValueError:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    rest_a = {k: v for k, v in a.items() if k not in LIMIT_FIELDS}
    rest_b = {k: v for k, v in b.items() if k not in LIMIT_FIELDS}
    return rest_a == rest_b


@dataclass
class Report:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    families: dict[str, Counter[str]] = field(default_factory=dict)
    altered: list[int] = field(default_factory=list)
    slow: list[int] = field(default_factory=list)
    ice_5xx: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def classify(s: Sent, got: bytes | None, report: Report) -> None:
    c = s.case
    if s.status == 0 and c.family == "oversized" and s.error == "ConnectionResetError":
        # refused before the upload ended (413 at the headers): Envoy closes the connection
        # while http.client, which sends all before it reads, is still writing
        outcome = "413:reset_before_read"
    elif s.status == 0:
        outcome = f"error:{s.error}"
        report.errors.append(f"{c.id} {c.family}: {s.error}")
    elif s.status >= 500:
        who = "ice" if "x-ice-decision" in s.headers else s.headers.get("server", "?")
        outcome = f"5xx:{s.status}:{who}"
        if who == "ice":
            report.ice_5xx.append(c.id)
    elif s.status >= 400:
        reason = s.headers.get(
            "x-ice-reason", "envoy" if "x-ice-decision" not in s.headers else "?"
        )
        outcome = f"{s.status}:{reason}"
    elif got is None:
        outcome = "2xx:not_at_backend"  # e.g. a read-only path answered by another route
    elif got == c.body or (c.chunked and got == c.body):
        outcome = "passed"
    elif only_limits_differ(c.body, got) and s.headers.get("x-ice-decision") == "downgrade":
        outcome = "mutated"
    else:
        outcome = "altered"
        report.altered.append(c.id)
    if s.seconds > SLOW_S:
        report.slow.append(c.id)
    report.outcomes[outcome] += 1
    report.families.setdefault(c.family, Counter())[outcome] += 1


def run(
    port: int, backend_url: str, count: int, seed: int = 1, concurrency: int = 8, batch: int = 400
) -> Report:
    """Send ``count`` cases; verify them against what the backend received."""
    report = Report()
    started = time.perf_counter()
    recorded(backend_url)  # start clean
    cases = mutations(count, seed)
    with ThreadPoolExecutor(concurrency) as pool:
        while True:
            chunk = [c for _, c in zip(range(batch), cases, strict=False)]
            if not chunk:
                break
            results = list(pool.map(lambda c: send(port, c), chunk))
            bodies = recorded(backend_url)
            for s in results:
                classify(s, bodies.get(s.case.id), report)
            report.sent += len(chunk)
    report.seconds = time.perf_counter() - started
    return report


def print_report(r: Report, crashes: int) -> None:
    print(
        f"{r.sent:,} requests in {r.seconds:.0f} s; ICE crashes {crashes}; over "
        f"{SLOW_S:.0f} s: {len(r.slow)}; altered: {len(r.altered)}; 5xx from ICE: "
        f"{len(r.ice_5xx)}"
    )
    for outcome, n in r.outcomes.most_common():
        print(f"  {outcome:<40} {n:>8,}")


def main(argv: list[str] | None = None) -> int:
    import throughput as tb

    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bodies", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ice-fuzz-") as tmp, Stack(Path(tmp)) as stack:
        backend, ice, ingress, admin = free_port(), free_port(), free_port(), free_port()
        backend_url = stack.start_backend(backend)
        policy = tb.write_policy(Path(tmp), f"{backend_url}/metrics")
        stack.start_ice(f"127.0.0.1:{ice}", policy=policy)
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": ingress},
            clusters={"ice": [f"127.0.0.1:{ice}"], "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        time.sleep(1.5)
        proc = stack.procs["ice"]
        report = run(ingress, backend_url, args.bodies, args.seed, args.concurrency)
        crashes = 0 if proc.poll() is None else 1
        print_report(report, crashes)
        if args.json:
            row = {
                "sent": report.sent,
                "seconds": report.seconds,
                "crashes": crashes,
                "outcomes": dict(report.outcomes),
                "families": {k: dict(v) for k, v in report.families.items()},
                "altered": report.altered,
                "slow": report.slow,
                "ice_5xx": report.ice_5xx,
                "errors": report.errors,
            }
            Path(args.json).write_text(json.dumps(row, indent=1))
        bad = crashes or report.altered or report.ice_5xx or report.slow
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
