"""What each request of a run got (``Shot``), and the pure reductions over a run's shots.

- ``Shot``: the status, when the request really started, the times to the headers, to the
  first token and to the end, the usage, and ICE's answer headers (decision, reason,
  ``retry-after``, ``x-downgraded``, ``x-ice-queued-ms``); ``is_ok``: a 200 whose stream
  ended without error; ``answered``: the status a client reads as the answer.
- ``drain_s`` (t0 to the end of the last request), ``goodput`` (Σ completion tokens of the
  200s whose time to first token was ≤ the SLO, over the drain time), ``by_reason`` (429s by
  ``x-ice-reason``), ``by_valve`` (503s by the valve their body names,
  ``arms.valve_reason``, or ICE's reason when ICE gave the 503), ``by_status`` (the other
  answers by status; ``0``: no answer, a transport error), ``tenant_breakdown`` and
  ``kind_breakdown`` (per tenant, per size class), ``quantile``.

Refusals: a 429 is ICE's (``x-ice-reason``), a 503 is vLLM's admission valve (or ICE's
answer for it, ``backend_overloaded``; ``-``: another 503, Envoy without an upstream). vLLM
refuses a *streamed* request with status 200 and an error event (``data: {"error": {...,
"code": 503}}``) instead of tokens: that counts as the 503 it says (``answered``); "other"
is everything else that was not ok.

Invariants: pure (no I/O); quantiles are nearest-rank, rounded to 3 decimals (seconds: ms),
None without values; "ok" is a 200 whose stream ended without error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ext_proc.lab.overload.arms import valve_reason

__all__ = [
    "Shot",
    "answered",
    "by_reason",
    "by_status",
    "by_valve",
    "drain_s",
    "goodput",
    "is_ok",
    "kind_breakdown",
    "quantile",
    "tenant_breakdown",
]


@dataclass
class Shot:
    """What one request of a run got."""

    index: int
    priority: str
    at_s: float
    status: int = 0
    latency_s: float = 0.0
    # Time to the response headers: the gateway's verdict plus vLLM's API server taking the
    # request (tokenising, queueing it in the engine); for a 429, the whole answer.
    headers_s: float | None = None
    # Time to the first streamed token (the wait in vLLM's queue plus prefill), or to the 429.
    ttft_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    retry_after: str | None = None
    decision: str | None = None
    reason: str | None = None
    downgraded: bool = False  # ICE lowered max_tokens (x-downgraded: true)
    error: str | None = None
    tenant: str | None = None
    # When the request really started, s after t0 (None: at its planned at_s).
    start_s: float | None = None
    # x-ice-queued-ms: how long ICE's admission queue held it (None: not queued).
    queued_ms: float | None = None
    kind: str = ""  # Planned.kind: the workload's size class ("" in the burst)
    # A 200 stream whose first event was an error (vLLM's valve refuses a streamed request so:
    # status 200, then ``data: {"error": {..., "code": 503}}``): that error's code.
    stream_code: int | None = None

    @property
    def end_s(self) -> float:
        """When the answer ended, s after t0."""
        return (self.at_s if self.start_s is None else self.start_s) + self.latency_s


def is_ok(s: Shot) -> bool:
    return s.status == 200 and s.error is None


def answered(s: Shot) -> int:
    """The status a client reads as the answer: the HTTP status, or the code of the error a
    200 stream carried instead of tokens (vLLM's valve answers a streamed request that way)."""
    return s.stream_code if s.stream_code else s.status


def drain_s(shots: Sequence[Shot]) -> float:
    """From t0 to the end of the last request (0.0 without shots)."""
    return max((s.end_s for s in shots), default=0.0)


def goodput(shots: Sequence[Shot], ttft_slo_s: float, drain: float | None = None) -> float:
    """Σ completion tokens of the ok shots whose time to first token was ≤ ``ttft_slo_s``,
    per second of ``drain`` (default: ``drain_s(shots)``); 0.0 when the drain time is 0."""
    drain = drain_s(shots) if drain is None else drain
    good = sum(
        s.completion_tokens
        for s in shots
        if is_ok(s) and s.ttft_s is not None and s.ttft_s <= ttft_slo_s
    )
    return good / drain if drain > 0 else 0.0


def by_reason(shots: Sequence[Shot]) -> dict[str, int]:
    """The 429s by ICE's ``x-ice-reason`` (``-``: none given), most first then by name."""
    counts: dict[str, int] = {}
    for s in shots:
        if s.status == 429:
            counts[s.reason or "-"] = counts.get(s.reason or "-", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def by_valve(shots: Sequence[Shot]) -> dict[str, int]:
    """The 503s by the valve their body names (``reqs``, ``tokens``), else by ICE's
    ``x-ice-reason`` (an ICE that answers a backend's 503 itself says ``backend_overloaded``;
    ``backend_asleep``), else ``-`` (another 503: Envoy's own); most first, then by name."""
    counts: dict[str, int] = {}
    for s in shots:
        if answered(s) == 503:
            reason = valve_reason(s.error)
            if reason == "-" and s.reason:
                reason = s.reason
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _refused(s: Shot) -> bool:
    return answered(s) in (429, 503)


def by_status(shots: Sequence[Shot]) -> dict[str, int]:
    """The answers neither ok nor refused (429, 503), by status (``"0"``: no status, a
    transport error; a 200 whose stream failed counts as ``"200"``), by status code."""
    counts: dict[int, int] = {}
    for s in shots:
        if not is_ok(s) and not _refused(s):
            counts[s.status] = counts.get(s.status, 0) + 1
    return {str(k): v for k, v in sorted(counts.items())}


def tenant_breakdown(
    shots: Sequence[Shot], ttft_slo_s: float | None = None
) -> dict[str, dict[str, Any]]:
    """Per tenant (in order of first appearance; none without tenants): its requests, ok,
    429s, how many ICE queued and the p95 of those waits (ms, over the queued ones), the
    p95 time to first token of its ok requests (s) and, given ``ttft_slo_s``, its goodput
    over its own drain (``goodput`` of its shots: from t0 to the end of its last request)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(s.tenant for s in shots if s.tenant is not None):
        mine = [s for s in shots if s.tenant == name]
        queued = [s.queued_ms for s in mine if s.queued_ms is not None]
        out[name] = {
            "requests": len(mine),
            "ok": sum(1 for s in mine if is_ok(s)),
            "shed_429": sum(1 for s in mine if s.status == 429),
            "queued": len(queued),
            "queued_ms_p95": quantile(queued, 0.95),
            "ttft_p95_s": quantile(
                [s.ttft_s for s in mine if is_ok(s) and s.ttft_s is not None], 0.95
            ),
        }
        if ttft_slo_s is not None:
            out[name]["goodput_tok_per_s"] = round(goodput(mine, ttft_slo_s), 2)
    return out


def kind_breakdown(
    shots: Sequence[Shot], ttft_slo_s: float, drain: float | None = None
) -> dict[str, dict[str, Any]]:
    """Per size class (``Shot.kind``, in order of first appearance; none in the burst): its
    requests, ok, 429s, 503s, TTFT p50 / p95 and end-to-end p95 of its ok requests (s), and
    its goodput (its tokens within the SLO over the whole run's ``drain``)."""
    drain = drain_s(shots) if drain is None else drain
    out: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(s.kind for s in shots if s.kind):
        mine = [s for s in shots if s.kind == kind]
        ok = [s for s in mine if is_ok(s)]
        waits = [s.ttft_s for s in ok if s.ttft_s is not None]
        out[kind] = {
            "requests": len(mine),
            "ok": len(ok),
            "shed_429": sum(1 for s in mine if s.status == 429),
            "refused_503": sum(1 for s in mine if answered(s) == 503),
            "ttft_p50_s": quantile(waits, 0.5),
            "ttft_p95_s": quantile(waits, 0.95),
            "e2e_p95_s": quantile([s.latency_s for s in ok], 0.95),
            "goodput_tok_per_s": round(goodput(mine, ttft_slo_s, drain), 1),
        }
    return out


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (q = 1.0: the maximum), rounded to ms; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return round(ordered[rank], 3)
