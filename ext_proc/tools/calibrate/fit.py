"""The calibration model: logistic regression of "hurt" on the pressure score's features.

Job: from features X (n × k, each 0-1, in time order) and labels y (0/1), fit weights of the
score's form and the thresholds where the probability of "hurt" crosses given levels, and
judge them on held-out time against the current (default) weights. Pure numpy, no state.

Features (columns, named by ``FEATURES``): x_kv = KV usage 0-1, x_queue = min(1, waiting
per backend / queue_saturation_requests), x_pcie = PCIe utilisation 0-1 (only when the
history has it). The score is s = Σ w_k x_k with Σ w_k = 1 (``mem_pressure_score`` / 100).

Model and fit, in order (training part = the first ``1 − holdout`` of the steps):
  1. Default mapping: w0 = the current weights of the present features, normalised to sum 1;
     fit P(hurt) = σ(a0 + c0 · s0), s0 = X w0 (two-parameter logistic, Newton).
  2. Prior: β0 = max(c0, 0) · w0 — the default weights scaled so that the default score sits
     on the logit scale the data gives it (then the prior says "the defaults are right").
  3. Full fit: minimise  Σ_i −[y_i log p_i + (1 − y_i) log(1 − p_i)] + (λ/2) ‖β − β0‖²,
     p_i = σ(b + x_i·β), intercept b unpenalised (Newton with step halving). λ (``l2``,
     default 10) counts against the summed log-loss: a short history stays near the
     defaults, a long one follows its data.
  4. Weights: w = max(β, 0) / Σ max(β, 0) (a negative coefficient means "this signal does
     not raise the risk": weight 0). None positive: no fit, the defaults stay.
  5. Thresholds: refit P(hurt) = σ(b1 + c1 · s), s = X w, on the training part; the level
     for probability p starts at score 100 · (logit(p) − b1) / c1, for p = 0.2 (medium),
     0.5 (high), 0.8 (critical) by default; clipped to [1, 100], rounded to 0.1 and made
     strictly ascending with 1 point between levels (the policy's rule). c1 ≤ 0: the
     current thresholds stay.
Quality, on the held-out part (the last ``holdout`` of the steps): log-loss (mean, natural
log, p clipped to [1e-12, 1 − 1e-12]) of σ(b1 + c1 · s) against σ(a0 + c0 · s0) — both
mappings fitted on the training part only — and AUC (Mann-Whitney, ties count half) of s
against s0. AUC is None when the held-out part has one class only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FEATURES",
    "Fit",
    "Quality",
    "auc",
    "fit_logistic",
    "fit_pressure",
    "log_loss",
    "thresholds_for",
]

Array = NDArray[np.float64]
FEATURES = ("kv", "queue", "pcie")
LEVEL_PROBABILITIES = (0.2, 0.5, 0.8)


@dataclass(frozen=True, slots=True)
class Quality:
    """Held-out fit quality of one set of weights."""

    log_loss: float
    auc: float | None


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted weights (feature → weight, Σ = 1) and thresholds, with their quality."""

    weights: dict[str, float]
    thresholds: tuple[float, float, float]
    fitted: Quality
    default: Quality
    train_steps: int
    test_steps: int
    test_hurt: int
    coef: tuple[float, ...]  # β of step 3, then b
    prior: tuple[float, ...]  # β0
    scale: tuple[float, float]  # (b1, c1) of step 5


def _sigmoid(z: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * z))
    return out


def log_loss(y: NDArray[np.int8], p: Array) -> float:
    """Mean negative log-likelihood (natural log), p clipped to [1e-12, 1 − 1e-12]."""
    q = np.clip(p, 1e-12, 1.0 - 1e-12)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1.0 - q)))


def auc(y: NDArray[np.int8], score: Array) -> float | None:
    """Area under the ROC curve (Mann-Whitney U, tied scores count half); None for one class."""
    pos = int(np.sum(y == 1))
    neg = int(y.shape[0]) - pos
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(s.shape[0], dtype=np.float64)
    i = 0
    while i < s.shape[0]:  # average ranks of ties
        j = i
        while j + 1 < s.shape[0] and s[j + 1] == s[i]:
            j += 1
        ranks[i : j + 1] = 0.5 * (i + j) + 1.0
        i = j + 1
    r = np.empty_like(ranks)
    r[order] = ranks
    u = float(np.sum(r[y == 1])) - pos * (pos + 1) / 2.0
    return u / (pos * neg)


def fit_logistic(
    x: Array,
    y: NDArray[np.int8],
    *,
    prior: Array | None = None,
    l2: float = 0.0,
    ridge: float = 1e-6,
    max_iter: int = 100,
) -> tuple[Array, float]:
    """(β, b) minimising Σ log-loss + (l2/2)‖β − prior‖² + (ridge/2)(‖β‖² + b²), Newton's
    method with step halving; ``ridge`` only keeps separable data finite."""
    n, k = x.shape
    p0 = np.zeros(k) if prior is None else prior.astype(np.float64)
    design = np.hstack([x, np.ones((n, 1))])
    theta = np.concatenate([p0, [0.0]])
    pen = np.full(k + 1, ridge)
    pen[:k] += l2
    centre = np.concatenate([p0 * l2 / (l2 + ridge) if l2 > 0 else np.zeros(k), [0.0]])

    def objective(th: Array) -> float:
        z = design @ th
        ll = float(np.sum(np.logaddexp(0.0, z) - y * z))
        return ll + 0.5 * float(np.sum(pen * (th - centre) ** 2))

    current = objective(theta)
    for _ in range(max_iter):
        p = _sigmoid(design @ theta)
        grad = design.T @ (p - y) + pen * (theta - centre)
        hess = (design * (p * (1.0 - p))[:, None]).T @ design + np.diag(pen)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-8:
            cand = theta - t * step
            value = objective(cand)
            if value <= current + 1e-12:
                break
            t *= 0.5
        else:
            break
        theta, improvement, current = cand, current - value, value
        if improvement < 1e-10 * max(1.0, abs(current)):
            break
    return theta[:k].copy(), float(theta[k])


def thresholds_for(
    b: float, c: float, probabilities: tuple[float, float, float] = LEVEL_PROBABILITIES
) -> tuple[float, float, float] | None:
    """Score (0-100) where σ(b + c · score/100) reaches each probability, clipped to
    [1, 100], rounded to 0.1, strictly ascending by ≥ 1; None when c ≤ 0."""
    if not c > 0:
        return None
    raw = [100.0 * (math.log(p / (1.0 - p)) - b) / c for p in probabilities]
    v = [round(min(100.0, max(1.0, r)), 1) for r in raw]
    v[2] = min(v[2], 100.0)
    v[1] = min(v[1], v[2] - 1.0)
    v[0] = min(v[0], v[1] - 1.0)
    v[0] = max(v[0], 1.0)
    v[1] = max(v[1], v[0] + 1.0)
    v[2] = max(v[2], v[1] + 1.0)
    return (round(v[0], 1), round(v[1], 1), round(v[2], 1))


def fit_pressure(
    x: Array,
    y: NDArray[np.int8],
    default_weights: Array,
    default_thresholds: tuple[float, float, float],
    *,
    features: tuple[str, ...],
    l2: float = 10.0,
    holdout: float = 0.2,
    probabilities: tuple[float, float, float] = LEVEL_PROBABILITIES,
) -> Fit | None:
    """Steps 1-5 of the module docstring. None when the training part has one class only
    (nothing to learn) or no coefficient comes out positive."""
    n = int(x.shape[0])
    n_train = math.floor((1.0 - holdout) * n)
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    if n_train < 2 or int(ytr.sum()) in (0, n_train):
        return None
    w0 = default_weights / float(np.sum(default_weights))
    s0_tr, s0_te = xtr @ w0, xte @ w0
    c0v, a0 = fit_logistic(s0_tr[:, None], ytr)
    c0 = float(c0v[0])
    prior = max(c0, 0.0) * w0
    beta, _b = fit_logistic(xtr, ytr, prior=prior, l2=l2)
    pos = np.maximum(beta, 0.0)
    if not float(np.sum(pos)) > 0:
        return None
    w = pos / float(np.sum(pos))
    s_tr, s_te = xtr @ w, xte @ w
    c1v, b1 = fit_logistic(s_tr[:, None], ytr)
    c1 = float(c1v[0])
    thresholds = thresholds_for(b1, c1, probabilities) or default_thresholds
    if xte.shape[0]:
        fitted = Quality(log_loss(yte, _sigmoid(b1 + c1 * s_te)), auc(yte, s_te))
        default = Quality(log_loss(yte, _sigmoid(a0 + c0 * s0_te)), auc(yte, s0_te))
    else:
        fitted = default = Quality(math.nan, None)
    return Fit(
        weights={f: float(v) for f, v in zip(features, w, strict=True)},
        thresholds=thresholds,
        fitted=fitted,
        default=default,
        train_steps=n_train,
        test_steps=n - n_train,
        test_hurt=int(yte.sum()),
        coef=(*(float(v) for v in beta), _b),
        prior=tuple(float(v) for v in prior),
        scale=(b1, c1),
    )
