"""``envoygen.late_guard``: the RBAC regex over ext_proc's filter state, and where the shipped
configs put the guard. The strings are Envoy 1.40's PLAIN form, as its access log printed
them (tests/e2e/test_late_guard.py runs the guard in real Envoy)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.late_guard import (
    LATE_POLICY,
    LATE_STATUSES,
    RBAC,
    late_guard_filter,
    late_reply_mappers,
)
from ext_proc.tools.envoygen.pieces import EXT_PROC

ENVOY = Path(__file__).resolve().parents[2] / "envoy"


@pytest.mark.parametrize(
    ("plain", "late"),
    [
        ("rh:1485:0,rb:1:1078:0,bs:458,br:354,os:0,ds:ice", False),  # judged
        ("rh:998608:4,bs:350,br:0,os:0,ds:ice", True),  # the headers' timer fired
        ("rh:1200:0,rb:1:1000412:4,bs:9000,br:120,os:0,ds:ice", True),  # the body's
        ("rh:415:14,bs:451,br:0,os:0,ds:ice", False),  # ICE unreachable: fail-open
        ("bs:0,br:0,os:14,ds:ice", False),  # no healthy ICE host: no call at all
        ("rh:4:0,rb:1:4:0,bs:1,br:1,os:0,ds:ice", False),  # 4 µs, answered
        ("rh:44:14,bs:1,br:0,os:0,ds:ice", False),  # 14 is not 4
        ("rh:100:4", True),  # the status last
    ],
    ids=["ok", "headers-late", "body-late", "down", "no-host", "4us", "14", "last"],
)
def test_the_regex_finds_a_deadline_exceeded_call(plain: str, late: bool) -> None:
    # RBAC's string matcher matches the whole string (RE2; this regex means the same in re)
    assert bool(re.fullmatch(LATE_STATUSES, plain)) is late


def test_the_filter_denies_on_the_ext_proc_filter_state() -> None:
    config = as_dict(late_guard_filter())["typed_config"]
    policy = config["rules"]["policies"][LATE_POLICY]
    assert config["rules"]["action"] == "DENY"
    (principal,) = policy["principals"]
    assert principal["filter_state"]["key"] == EXT_PROC
    assert principal["filter_state"]["string_match"]["safe_regex"]["regex"] == LATE_STATUSES
    assert config["rules_stat_prefix"] == f"{LATE_POLICY}."


def test_the_reply_is_a_429_with_retry_after_in_the_apis_format() -> None:
    anthropic, openai = (as_dict(m) for m in late_reply_mappers())
    for mapper in (anthropic, openai):
        assert mapper["status_code"] == 429
        headers = {h["header"]["key"]: h["header"]["value"] for h in mapper["headers_to_add"]}
        assert headers == {
            "retry-after": "1",
            "x-ice-decision": "reject",
            "x-ice-reason": "ice_late",
        }
    assert anthropic["body_format_override"]["json_format"]["type"] == "error"
    assert openai["body_format_override"]["json_format"]["error"]["code"] == "ice_late"


@pytest.mark.parametrize("name", ["envoy.yaml", "bench.yaml"])
def test_the_shipped_configs_guard_right_after_ext_proc_with_no_panic_routing(name: str) -> None:
    config: dict[str, Any] = yaml.safe_load((ENVOY / name).read_text())
    ingress = config["static_resources"]["listeners"][0]
    hcm = ingress["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names[names.index(EXT_PROC) + 1] == RBAC
    mappers = hcm["local_reply_config"]["mappers"]
    assert [m.get("status_code") for m in mappers[:2]] == [429, 429]
    (ice,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "ice"]
    assert ice["common_lb_config"] == {"healthy_panic_threshold": {}}


@pytest.mark.parametrize("name", ["envoy.yaml", "bench.yaml"])
def test_the_ingress_speaks_http2_as_envoy_recommends_at_the_edge(name: str) -> None:
    """100 streams a client connection, 64 KiB stream and 1 MiB connection windows
    (``local.EDGE_H2_*``; docs/flood.md: fewer late requests over one shared connection)."""
    config: dict[str, Any] = yaml.safe_load((ENVOY / name).read_text())
    ingress = config["static_resources"]["listeners"][0]
    hcm = ingress["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["http2_protocol_options"] == {
        "max_concurrent_streams": 100,
        "initial_stream_window_size": 65536,
        "initial_connection_window_size": 1048576,
    }
