"""The configuration reference lists every metric ICE exports, and only those."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from ext_proc import telemetry

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _exported() -> dict[str, tuple[str, ...]]:
    """Metric name as scraped (counters with ``_total``) → label names."""
    out: dict[str, tuple[str, ...]] = {}
    for value in vars(telemetry).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            out[name] = tuple(value._labelnames)
    return out


def _documented() -> dict[str, tuple[str, ...]]:
    section = DOC.read_text().split("## ICE's own metrics", 1)[1].split("\n## ", 1)[0]
    out: dict[str, tuple[str, ...]] = {}
    for row in re.finditer(r"^\| `(ice_[a-z_]+)` \| ([^|]*) \|", section, re.M):
        labels = re.sub(r"\([^)]*\)", "", row.group(2))
        out[row.group(1)] = tuple(x.strip() for x in labels.split(",") if x.strip())
    return out


def test_every_exported_metric_is_documented_with_its_labels() -> None:
    exported, documented = _exported(), _documented()
    assert exported, "no metrics found in ext_proc.telemetry"
    assert sorted(exported) == sorted(documented)
    for name, labels in exported.items():
        assert sorted(labels) == sorted(documented[name]), name
