"""What both walkthroughs share: the loopback URLs, one blocking HTTP call, the verdict
headers shown per step, and the long chat whose last question needs its first turn.

Invariant: no I/O at import; ``_http`` never raises on an HTTP error status (it returns the
status, the lower-cased headers and the body), only on a transport error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

ENVOY_URL = "http://127.0.0.1:10000"
BACKEND_URL = "http://127.0.0.1:8000"
SHOWN = (
    "x-mem-pressure",
    "x-mem-pressure-score",
    "x-ice-decision",
    "x-ice-truncated",
    "x-ice-reason",
    "x-downgraded",
    "x-ice-original-max-tokens",
    "x-ice-sequences",
    "retry-after",
)


def _http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


# A long chat whose last question needs its first turn (the dev demo's truncation step).
_TURNS = (
    ("Which ryokan near Gion in Kyoto has a private onsen?", "Gion Hatanaka, by Yasaka Shrine."),
    ("How do I undo my last git commit?", "git reset --soft HEAD~1 keeps the changes staged."),
    ("A good low-light houseplant?", "A ZZ plant or a snake plant tolerates shade well."),
    ("How do I fix a dripping faucet?", "Replace the cartridge or its worn O-rings."),
    ("Explain compound interest briefly.", "Interest earns interest, so growth compounds."),
    ("Stretches for a stiff lower back?", "Cat-cow, child's pose and knee-to-chest stretches."),
    ("How long should I boil an egg?", "Nine to twelve minutes for a firm yolk."),
    ("Best way to store fresh basil?", "Stems in a glass of water at room temperature."),
    ("What is a Roth IRA?", "A retirement account funded after tax; withdrawals are tax-free."),
)
_QUESTION = "Does that inn near the shrine serve vegetarian dinners?"


# Day two, printed with the "Try:" lines of both walkthroughs.
DAY_TWO = """\
  .venv/bin/ice doctor --envoy-admin http://127.0.0.1:9901 --ice 127.0.0.1:50051   # the checklist
  # shadow rollout: add `mode: shadow` to a profile of the policy ICE serves (a hot reload);
  # requests then go on unchanged with the verdict in x-ice-shadow-decision / -reason"""


def prefix_report_demo(requests: int = 40) -> str:
    """``ice prefix-report`` on requests whose system prompt starts with a timestamp: what
    the demo prints to show why such a route defeats vLLM's prefix cache."""
    from ext_proc.prefix.report import build_report, format_text

    shared = "You are the support assistant of a travel agency. Answer briefly. " * 6
    records: list[tuple[str, dict[str, Any]]] = []
    for i in range(requests):
        system = f"Current time: 2026-12-02T07:{i // 60:02d}:{i % 60:02d}Z. {shared}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}?"},
        ]
        records.append(("chat", {"model": "m", "messages": messages}))
    return format_text(build_report(records), 16, "pseudo-tokens")
