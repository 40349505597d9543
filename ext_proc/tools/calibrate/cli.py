"""``ice calibrate``: propose a profile's pressure weights and thresholds from a history.

Job: parse the options, read the history (``--prometheus`` or ``--pages``), label it, fit
(``fit.fit_pressure``), print the fitted values with their held-out quality against the
current ones, and write the policy fragment (``--out``). Never changes a policy.

Defaults: the policy is the built-in one unless ``--policy``; the pool and profile are its
defaults unless named; ``--since 7d``, ``--step 30s`` (Prometheus; pages: their own spacing),
``--horizon 30s``, ``--queue-limit`` = the profile's queue_saturation_requests (waiting per
backend), ``--ttft-target`` = the profile's ttft_target_s, ``--ttft-share 0.1``,
``--probabilities 0.2,0.5,0.8``, ``--l2 10``, ``--holdout 0.2``.
Exit codes: 0 (a fit, or no events / nothing to learn: the current values unchanged),
2 (bad input: one line on stderr).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from ext_proc.policy.settings import PressureModel
from ext_proc.tools.calibrate.fit import FEATURES, Fit, fit_pressure
from ext_proc.tools.calibrate.history import History, InputError, hurt_labels, outcome_events

__all__ = ["fragment", "main", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?")
_FIELD = {"kv": "weight_kv_cache", "queue": "weight_queue", "pcie": "weight_pcie"}


def parse_duration(text: str) -> float:
    """``30s``, ``5m``, ``7d``, ``1.5h``, ``250ms`` or plain seconds → seconds (> 0)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise InputError(f"not a duration: {text!r} (e.g. 30s, 5m, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InputError(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="ice calibrate", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus server (range queries)")
    src.add_argument("--pages", metavar="DIR", help="folder of recorded /metrics pages")
    ap.add_argument("--policy", metavar="FILE", help="policy file (default: the built-in one)")
    ap.add_argument("--pool", help="pool: kind, Prometheus matchers, group_by, PCIe bandwidth")
    ap.add_argument("--profile", help="profile whose pressure block is calibrated")
    ap.add_argument("--since", default="7d", help="history length back from --until (7d)")
    ap.add_argument("--until", type=float, help="end of the history, Unix seconds (now)")
    ap.add_argument("--step", help="grid step (Prometheus: 30s; pages: their spacing)")
    ap.add_argument("--matchers", help='label matchers, e.g. job="vllm" (the pool\'s)')
    ap.add_argument("--group-by", help="label telling backends apart (the pool's, instance)")
    ap.add_argument("--gpu-matchers", help="DCGM exporter series for PCIe (default: no PCIe)")
    ap.add_argument("--kind", choices=("vllm", "sglang"), help="engine kind (the pool's)")
    ap.add_argument("--horizon", default="30s", help="an event this soon after a step hurts it")
    ap.add_argument("--queue-limit", type=float, help="waiting per backend that is an event")
    ap.add_argument("--ttft-target", type=float, help="TTFT target, s (the profile's)")
    ap.add_argument("--ttft-share", type=float, default=0.1, help="share over target: event")
    ap.add_argument("--probabilities", default="0.2,0.5,0.8", help="P(hurt) of each level")
    ap.add_argument("--l2", type=float, default=10.0, help="pull towards the current weights")
    ap.add_argument("--holdout", type=float, default=0.2, help="held-out share, the latest")
    ap.add_argument("--out", metavar="FILE", help="write the policy fragment (YAML) here")
    return ap


def fragment(
    profile: str,
    model: PressureModel,
    weights: dict[str, float] | None,
    thresholds: tuple[float, float, float] | None,
    note: str,
) -> str:
    """The YAML fragment ``profiles.<profile>.pressure`` (current values where not fitted)."""
    w = weights or {"kv": model.weight_kv_cache, "queue": model.weight_queue}
    th = thresholds or (model.medium_at, model.high_at, model.critical_at)
    lines = [
        f"# ice calibrate: {note}",
        "# Review before use: ICE never applies it.",
        "profiles:",
        f"  {profile}:",
        "    pressure:",
    ]
    for feature in FEATURES:
        if feature in w:
            lines.append(f"      {_FIELD[feature]}: {round(w[feature], 3):g}")
    lines.append(f"      queue_saturation_requests: {model.queue_saturation_requests:g}")
    lines.append(f"      thresholds: {{medium: {th[0]:g}, high: {th[1]:g}, critical: {th[2]:g}}}")
    return "\n".join(lines) + "\n"


def _features(
    h: History, known: np.ndarray, sat: float
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    if bool(np.any(~np.isnan(h.kv))):
        cols["kv"] = np.clip(h.kv, 0.0, 1.0)
    if bool(np.any(~np.isnan(h.waiting))):
        cols["queue"] = np.minimum(1.0, np.maximum(0.0, h.waiting) / sat)
    if h.pcie is not None:
        cols["pcie"] = np.clip(h.pcie, 0.0, 1.0)
    if not cols:
        raise InputError("the history has neither KV usage nor waiting requests")
    names = tuple(f for f in FEATURES if f in cols)
    x = np.column_stack([cols[f] for f in names])
    keep = known & ~np.any(np.isnan(x), axis=1)
    return names, x, keep


def _read(args: argparse.Namespace) -> tuple[History, PressureModel, str, float, str]:
    from ext_proc.policy.load import PolicyError, load_policy

    try:
        policy = load_policy(args.policy)
    except (PolicyError, OSError) as e:
        raise InputError(f"policy: {e!s:.200}") from None
    pool_name = args.pool or policy.default_pool
    prof_name = args.profile or policy.default_profile
    if pool_name not in policy.pools:
        raise InputError(f"no pool {pool_name!r} in the policy")
    if prof_name not in policy.profiles:
        raise InputError(f"no profile {prof_name!r} in the policy")
    pool, profile = policy.pools[pool_name], policy.profiles[prof_name]
    target = profile.ttft_target_s if args.ttft_target is None else args.ttft_target
    step = parse_duration(args.step) if args.step else None
    if args.pages:
        from ext_proc.tools.calibrate.pages import history_from_pages

        h = history_from_pages(
            Path(args.pages),
            kind=args.kind,
            ttft_target_s=target,
            step_s=step,
            pcie_bandwidth_bytes_s=pool.pcie_bandwidth_bytes_s,
        )
        where = f"pages {args.pages}"
    else:
        from ext_proc.tools.calibrate.prom import history_from_prometheus

        end = time.time() if args.until is None else args.until
        h = history_from_prometheus(
            args.prometheus,
            kind=args.kind or pool.kind,
            start=end - parse_duration(args.since),
            end=end,
            step=step or 30.0,
            ttft_target_s=target,
            matchers=pool.prometheus_matchers if args.matchers is None else args.matchers,
            group_by=args.group_by or pool.prometheus_group_by,
            gpu_matchers=args.gpu_matchers,
            pcie_bandwidth_bytes_s=pool.pcie_bandwidth_bytes_s,
        )
        where = f"Prometheus {args.prometheus}"
    return h, profile.pressure, prof_name, target, f"pool {pool_name}, {where}"


def _table(model: PressureModel, names: tuple[str, ...], fit: Fit) -> list[str]:
    cur = {"kv": model.weight_kv_cache, "queue": model.weight_queue, "pcie": model.weight_pcie}
    total = sum(cur[f] for f in names)
    rows = [f"{'':26}{'current':>10}{'fitted':>10}"]
    for f in names:
        rows.append(
            f"{_FIELD[f] + ' (normalised)':26}{cur[f] / total:>10.3f}{fit.weights[f]:>10.3f}"
        )
    for lv, c, v in zip(
        ("medium", "high", "critical"),
        (model.medium_at, model.high_at, model.critical_at),
        fit.thresholds,
        strict=True,
    ):
        rows.append(f"{'thresholds.' + lv:26}{c:>10g}{v:>10g}")
    auc = [("–" if q.auc is None else f"{q.auc:.3f}") for q in (fit.default, fit.fitted)]
    rows.append(f"held-out ({fit.test_steps} steps, {fit.test_hurt} hurt, the latest):")
    rows.append(f"{'  log-loss':26}{fit.default.log_loss:>10.4f}{fit.fitted.log_loss:>10.4f}")
    rows.append(f"{'  AUC':26}{auc[0]:>10}{auc[1]:>10}")
    return rows


def _run(args: argparse.Namespace) -> int:
    probs = tuple(float(p) for p in args.probabilities.split(","))
    if len(probs) != 3 or not all(0 < p < 1 for p in probs) or not probs[0] < probs[1] < probs[2]:
        raise InputError("--probabilities: three ascending numbers in (0, 1)")
    if not 0 <= args.holdout < 1 or args.l2 < 0:
        raise InputError("--holdout must be in [0, 1) and --l2 ≥ 0")
    h, model, prof, target, where = _read(args)
    limit = model.queue_saturation_requests if args.queue_limit is None else args.queue_limit
    ev = outcome_events(h, queue_limit=limit, ttft_share=args.ttft_share)
    horizon = parse_duration(args.horizon)
    hurt, known = hurt_labels(h.t, ev.any, horizon)
    names, x, keep = _features(h, known, model.queue_saturation_requests)
    if not bool(np.any(keep)):
        raise InputError("no step with every signal and a full horizon after it")
    print(
        f"ice calibrate: {where}, profile {prof}: {len(h)} steps, {len(h.backends)} backends, "
        f"{int(keep.sum())} labelled, horizon {horizon:g} s, features {', '.join(names)}"
    )
    print(
        f"events: {int(ev.any.sum())} steps (preemptions {int(ev.preemption.sum())}, waiting > "
        f"{limit:g}/backend {int(ev.queue.sum())}, TTFT > {target:g} s for > "
        f"{args.ttft_share:.0%} {int(ev.ttft.sum())}); hurt {int(hurt[keep].sum())} steps"
    )
    fit = None
    if not bool(np.any(ev.any)):
        note = "no outcome events in the history: the current values, unchanged"
    else:
        cur = {"kv": model.weight_kv_cache, "queue": model.weight_queue, "pcie": model.weight_pcie}
        w0 = np.array([cur[f] for f in names])
        if not float(w0.sum()) > 0:
            w0 = np.ones(len(names))
        fit = fit_pressure(
            x[keep],
            hurt[keep],
            w0,
            (model.medium_at, model.high_at, model.critical_at),
            features=names,
            l2=args.l2,
            holdout=args.holdout,
            probabilities=probs,
        )
        note = (
            "nothing to learn (one class in the training part, or no signal raises the "
            "risk): the current values, unchanged"
            if fit is None
            else f"fitted from {where}, {fit.train_steps} training steps"
        )
    print(note)
    if fit is not None:
        print("\n".join(_table(model, names, fit)))
        if "pcie" not in names:
            print(
                "PCIe is not in the history: weight_pcie is not fitted (the policy's value "
                "stays; it takes part only with the pool's GPU sources)"
            )
    text = fragment(
        prof,
        model,
        None if fit is None else fit.weights,
        None if fit is None else fit.thresholds,
        note,
    )
    print("\n" + text, end="")
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as e:
            raise InputError(f"--out {args.out}: {e.strerror or e}") from None
        print(f"wrote {args.out} (not applied: review it, then copy it into the policy)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``ice calibrate`` entry point; returns the exit code."""
    try:
        return _run(_parser().parse_args(sys.argv[1:] if argv is None else argv))
    except InputError as e:
        print(
            f"ice calibrate: error: {str(e).splitlines()[0] if str(e) else 'bad input'}",
            file=sys.stderr,
        )
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
