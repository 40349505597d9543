"""``ice calibrate``: pressure weights and thresholds learned from a pool's outcomes.

Job: read a history of a pool's signals (Prometheus range queries or recorded ``/metrics``
pages), label each time step "hurt" when an outcome event (a preemption, a queue above a
limit, too many first tokens later than the profile's TTFT target) follows within a horizon,
fit a logistic regression of "hurt" on the pressure score's features, and propose the
``profiles.<p>.pressure`` weights and thresholds that fit it, with their held-out quality
against the current values. Nothing is ever applied: the result is printed and written as a
policy fragment for the operator to review (docs/calibrate.md).

Modules: ``history`` (the common per-step history, outcome events, labels), ``fit`` (the
model), ``pages`` and ``prom`` (the two sources), ``cli`` (``main(argv)``).
"""

from __future__ import annotations

__all__: list[str] = []
