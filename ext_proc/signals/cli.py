"""``ice signals SOURCE``: what does ICE see from this source?

SOURCE is a ``/metrics`` URL, a saved page (``-`` for stdin), or ``nvml`` (this host's GPUs).
The page's kind (vLLM, SGLang, DCGM exporter) is detected unless ``--kind`` says it. Prints
the normalised record(s) as a table, or with ``--json`` every field as JSON (histogram bounds
as numbers, the last one ``"+Inf"``). ``--window S`` (URLs) scrapes twice, S seconds apart,
and adds the rates and windowed quantiles ICE derives (among them vLLM's own valve:
admission rejections per second, and whether it rejected any between the two scrapes).
``sleep_state`` is vLLM's engine sleep state (anything but ``awake``: asleep). The
``forecast`` rows are what ``admission: forecast`` reads of the source
(``docs/forecast.md``): the decode rate r per running sequence, the first-token delay d, the
limit share and, with ``--window``, whether the preemption counter rose (a worker with
requests running there would raise its caution to 1). The ``slo`` rows are the latency
predictions of ``docs/slo.md``: the prefill speed, a mean request's predicted TTFT now, the
decode step line and the predicted TPOT, and the TTFT prediction's own error over the window
(``--scrapes N``: scrape N times over the window, default 2; the error needs 3 or more).

Exit status: 0 shown; 1 the source could not be read or parsed (one line on stderr);
2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ext_proc.signals.parse import SourceParseError, detect_kind, parse_dcgm, parse_engine
from ext_proc.signals.poolbuild import backend_signals, limit_share
from ext_proc.signals.scrapes import Derived, EngineScrape, GpuScrape, Histogram
from ext_proc.signals.window import derive, histogram_quantile

__all__ = ["main"]


class SourceError(Exception):
    """The source could not be read."""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ice signals", description="Show the signals ICE reads from one source."
    )
    ap.add_argument("source", help="a /metrics URL, a saved page ('-' for stdin), or 'nvml'")
    ap.add_argument("--kind", choices=("vllm", "sglang", "dcgm"), help="default: detected")
    ap.add_argument("--json", action="store_true", help="every field, as JSON")
    ap.add_argument("--timeout", type=float, default=5.0, help="fetch timeout, seconds")
    ap.add_argument(
        "--window", type=float, metavar="S", help="URL only: scrape twice S seconds apart"
    )
    ap.add_argument(
        "--scrapes", type=int, default=2, metavar="N", help="with --window: scrapes (≥ 2)"
    )
    return ap


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _read(source: str, timeout_s: float) -> str:
    try:
        if _is_url(source):
            req = urllib.request.Request(source, headers={"Accept": "text/plain"})
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                body: bytes = resp.read()
            return body.decode("utf-8", errors="replace")
        if source == "-":
            return sys.stdin.read()
        return Path(source).read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError) as e:  # URLError is an OSError
        raise SourceError(f"cannot read {source}: {e}") from None


# -- rendering -----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _record(obj: Any) -> Any:
    return _jsonable(dataclasses.asdict(obj))


def _num(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        text = str(int(value))
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return f"{text} {unit}".rstrip()


def _bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _hist(h: Histogram | None, unit: str = "s") -> str:
    if h is None:
        return "-"
    p50, p95 = histogram_quantile(0.5, h), histogram_quantile(0.95, h)
    return f"{_num(h.count)} observations, p50 {_num(p50, unit)}, p95 {_num(p95, unit)}"


def _sleep(state: str | None) -> str:
    if state is None:
        return "-"
    return state if state == "awake" else f"{state} (asleep)"


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _engine_table(s: EngineScrape) -> list[tuple[str, str]]:
    return [
        ("source", s.source),
        ("kind", s.kind),
        ("models", ", ".join(s.models) or "-"),
        ("kv_cache_usage", _num(s.kv_cache_usage)),
        ("num_requests_running", _num(s.num_requests_running)),
        ("num_requests_waiting", _num(s.num_requests_waiting)),
        ("waiting_by_reason", ", ".join(f"{r}={_num(v)}" for r, v in s.waiting_by_reason) or "-"),
        ("sleep_state", _sleep(s.sleep_state)),
        ("num_gpu_blocks", _num(s.num_gpu_blocks)),
        ("block_size", _num(s.block_size, "tokens")),
        ("kv_capacity_tokens", _num(s.kv_capacity_tokens)),
        ("cache_hit_rate", _num(s.cache_hit_rate)),
        ("preemptions (total)", _num(s.preemptions)),
        ("prefix_cache_queries_tokens (total)", _num(s.prefix_cache_queries_tokens)),
        ("prefix_cache_hits_tokens (total)", _num(s.prefix_cache_hits_tokens)),
        ("prompt_tokens (total)", _num(s.prompt_tokens)),
        ("generation_tokens (total)", _num(s.generation_tokens)),
        ("request_success (total)", _num(s.request_success)),
        ("finished_by_reason", ", ".join(f"{r}={_num(v)}" for r, v in s.finished_by_reason) or "-"),
        ("limit_share (since start)", _num(limit_share(s.finished_by_reason))),
        ("admission_rejections (total)", _num(s.admission_rejections)),
        ("ttft_s (since start)", _hist(s.ttft_s)),
        ("queue_time_s (since start)", _hist(s.queue_time_s)),
        # the forecast's inputs (docs/forecast.md): output lengths and the decode rate
        ("output_lengths (since start)", _hist(s.output_lengths, "tokens")),
        ("itl_s (since start)", _hist(s.itl_s)),
    ]


def _derived_table(d: Derived) -> list[tuple[str, str]]:
    return [
        ("window_s", _num(d.window_s, "s")),
        ("prefix_cache_hit_ratio", _num(d.prefix_cache_hit_ratio)),
        ("preemptions_per_s", _num(d.preemptions_per_s)),
        ("prompt_tokens_per_s", _num(d.prompt_tokens_per_s)),
        ("generation_tokens_per_s", _num(d.generation_tokens_per_s)),
        ("completions_per_s", _num(d.completions_per_s)),
        ("ttft_p50_s", _num(d.ttft_p50_s, "s")),
        ("ttft_p95_s", _num(d.ttft_p95_s, "s")),
        ("queue_time_p95_s", _num(d.queue_time_p95_s, "s")),
        ("ttft observations in window", _num(d.ttft_delta.count if d.ttft_delta else None)),
        ("admission_rejections_per_s", _num(d.admission_rejections_per_s)),
        ("admission_rejected_recently", _flag(d.admission_rejected_recently)),
    ]


def _forecast(first: EngineScrape, newest: EngineScrape, derived: Derived | None) -> dict[str, Any]:
    """What the forecast reads of the source (the module docstring)."""
    b = backend_signals(newest, derived)
    rose: float | None = None
    if derived is not None and first.preemptions is not None and newest.preemptions is not None:
        rose = max(0.0, newest.preemptions - first.preemptions)
    return {
        "decode_rate_tok_per_s": b.decode_rate,
        "rate_from": (
            None
            if b.decode_rate is None
            else "window"
            if b.itl_mean_s and b.decode_rate < 1.0 / b.itl_mean_s
            else "itl_mean"
        ),
        "first_token_delay_s": b.first_token_delay_s if derived is not None else None,
        "limit_share": b.limit_share,
        "preemptions_in_window": rose,
        "caution_raised": None if rose is None else rose > 0,
    }


def _forecast_table(f: dict[str, Any], windowed: bool) -> list[tuple[str, str]]:
    how = {
        "itl_mean": "1 / mean inter-token latency since start",
        "window": "window generation rate / running",
    }.get(f["rate_from"] or "", "no inter-token latency histogram")
    if f["caution_raised"] is None:
        caution = "-" if not windowed else "- (no preemption counter)"
    elif f["caution_raised"]:
        caution = "rose: a worker with requests running here raises its caution to 1"
    else:
        caution = "no rise"
    return [
        ("forecast: decode rate", f"{_num(f['decode_rate_tok_per_s'], 'tok/s')} ({how})"),
        ("forecast: first-token delay", _num(f["first_token_delay_s"], "s")),
        ("forecast: limit share", _num(f["limit_share"])),
        ("forecast: preemptions in window", _num(f["preemptions_in_window"])),
        ("forecast: caution", caution),
    ]


def _slo(newest: EngineScrape, derived: Derived | None) -> dict[str, Any]:
    """The latency predictions of the source (docs/slo.md)."""
    b = backend_signals(newest, derived)
    sp = b.speed
    if sp is None:
        return {}
    mean = sp.computed_prompt_tokens
    hit = b.hit_ratio or 0.0
    # a mean request: its prompt is the mean computed prompt, before the expected hit
    prompt = mean / (1.0 - hit) if mean is not None and hit < 1.0 else mean
    return {
        "prefill_tokens_per_s": sp.prefill_tokens_per_s,
        "computed_prompt_tokens": mean,
        "ttft_overhead_s": sp.ttft_overhead_s,
        "predicted_ttft_s": b.predicted_ttft_s(prompt) if prompt is not None else None,
        "step_base_s": sp.step_base_s,
        "step_per_running_s": sp.step_per_running_s,
        "step_points": sp.step_points,
        "token_step_fixed_s": sp.token_step_fixed_s,
        "token_step_per_token_s": sp.token_step_per_token_s,
        "token_step_points": sp.token_step_points,
        "predicted_tpot_s": b.predicted_tpot_s,
        "ttft_error_ratio": sp.ttft_error_ratio,
        "ttft_error_points": sp.ttft_error_points,
    }


def _slo_table(f: dict[str, Any]) -> list[tuple[str, str]]:
    if not f:
        return [("slo: predictions", "- (needs --window)")]
    line = "-"
    if f["step_base_s"] is not None:
        line = (
            f"{_num(f['step_base_s'] * 1e3, 'ms')} + {_num(f['step_per_running_s'] * 1e3, 'ms')}"
            f" × running ({f['step_points']} points)"
        )
    engine = "-"
    if f.get("token_step_per_token_s") is not None:
        engine = (
            f"{_num(f['token_step_fixed_s'] * 1e3, 'ms')} + "
            f"{_num(f['token_step_per_token_s'] * 1e6, 'µs')} × tokens "
            f"({f['token_step_points']} points)"
        )
    error = "-"
    if f["ttft_error_ratio"] is not None:
        error = f"{f['ttft_error_ratio']:.1%} mean abs ({f['ttft_error_points']} intervals)"
    ttft, tpot = f["predicted_ttft_s"], f["predicted_tpot_s"]
    rest = f.get("ttft_overhead_s")
    return [
        ("slo: prefill speed", _num(f["prefill_tokens_per_s"], "tok/s")),
        ("slo: mean computed prompt", _num(f["computed_prompt_tokens"], "tokens")),
        (
            "slo: rest of TTFT (not queued or prefilling)",
            _num(None if rest is None else rest * 1e3, "ms"),
        ),
        ("slo: predicted TTFT (mean request)", _num(None if ttft is None else ttft * 1e3, "ms")),
        ("slo: engine step", engine),
        ("slo: decode step", line),
        ("slo: predicted TPOT (running + 1)", _num(None if tpot is None else tpot * 1e3, "ms")),
        ("slo: TTFT prediction error", error),
    ]


def _table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _gpu_table(gpus: Sequence[GpuScrape]) -> str:
    head = ("gpu", "uuid", "host", "pod", "fb_used", "fb_free", "fb_total", "util", "pcie_tx/rx")
    rows = [head] + [
        (
            g.gpu,
            g.uuid or "-",
            g.host or "-",
            f"{g.namespace}/{g.pod}" if g.pod else "-",
            _bytes(g.fb_used_bytes),
            _bytes(g.fb_free_bytes),
            _bytes(g.fb_total_bytes),
            "-" if g.gpu_util is None else f"{g.gpu_util:.0%}",
            f"{_num(g.pcie_tx_bytes_s)}/{_num(g.pcie_rx_bytes_s)} B/s",
        )
        for g in gpus
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


# -- the command ---------------------------------------------------------------------------


def _nvml(as_json: bool) -> int:
    from ext_proc.signals.nvml import NvmlSource

    src = NvmlSource()
    gpus = src.read(time.monotonic())
    src.close()
    if not gpus and src.reason:
        print(f"ice signals: {src.reason}", file=sys.stderr)
        return 1
    print(json.dumps([_record(g) for g in gpus], indent=2) if as_json else _gpu_table(gpus))
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.source == "nvml":
        return _nvml(args.json)
    text = _read(args.source, args.timeout)
    at_s = time.monotonic()
    kind = args.kind or detect_kind(text)
    if kind == "dcgm":
        gpus = parse_dcgm(args.source, text, at_s)
        print(json.dumps([_record(g) for g in gpus], indent=2) if args.json else _gpu_table(gpus))
        return 0
    first = parse_engine(kind, args.source, text, at_s)
    derived: Derived | None = None
    newest = first
    if args.window:
        scrapes = [first]
        for _ in range(args.scrapes - 1):
            time.sleep(args.window / (args.scrapes - 1))
            text = _read(args.source, args.timeout)
            scrapes.append(parse_engine(kind, args.source, text, time.monotonic()))
        newest = scrapes[-1]
        derived = derive(scrapes, args.window + 1.0)
    forecast = _forecast(first, newest, derived)
    slo = _slo(newest, derived)
    if args.json:
        out: dict[str, Any] = {"scrape": _record(newest)}
        if derived is not None:
            out["derived"] = _record(derived)
        out["forecast"] = _jsonable(forecast)
        out["slo"] = _jsonable(slo)
        print(json.dumps(out, indent=2))
    else:
        print(_table(_engine_table(newest)))
        if derived is not None:
            print()
            print(_table(_derived_table(derived)))
        print()
        print(_table(_forecast_table(forecast, derived is not None)))
        print()
        print(_table(_slo_table(slo)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.scrapes < 2:
        print("ice signals: --scrapes needs 2 or more", file=sys.stderr)
        return 2
    if args.window is not None and (args.window <= 0 or not _is_url(args.source)):
        print("ice signals: --window needs a URL and a positive number of seconds", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except (SourceError, SourceParseError) as e:
        print(f"ice signals: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
