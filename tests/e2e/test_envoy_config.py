"""Every Envoy config in envoy/ is one Envoy accepts, as written and as the stack renders it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.stack import ENVOY_DIR, envoy_binary, render_envoy_config

from .harness import ENVOY_TEMPLATE


def _is_envoy_config(path: Path) -> bool:
    """Kubernetes manifests (documents with a top-level ``apiVersion``) are not bootstraps."""
    docs = list(yaml.safe_load_all(path.read_text()))
    return not any(isinstance(d, dict) and "apiVersion" in d for d in docs)


CONFIGS = sorted(ENVOY_DIR.rglob("*.yaml"))


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_envoy_dir_holds_the_stack_config() -> None:
    assert ENVOY_TEMPLATE in CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ENVOY_DIR)) for p in CONFIGS])
def test_envoy_config_passes_envoy_validate(path: Path) -> None:
    if not _is_envoy_config(path):
        pytest.skip(f"{path.name} is not an Envoy bootstrap (top-level apiVersion)")
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_with_two_ice_workers_passes_envoy_validate(tmp_path: Path) -> None:
    config: dict[str, Any] = render_envoy_config(
        ENVOY_TEMPLATE,
        admin_port=19901,
        listeners={"ingress": 18080},
        clusters={"ice": ["127.0.0.1:15051", "127.0.0.1:15052"], "backend": ["127.0.0.1:18000"]},
    )
    endpoints = config["static_resources"]["clusters"]
    ice = next(c for c in endpoints if c["name"] == "ice")
    assert len(ice["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    path = tmp_path / "rendered.json"
    path.write_text(json.dumps(config))
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
