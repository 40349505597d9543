"""Active-passive ICE behind plain Envoy: ICE's cluster in priority levels, one address each
(``pieces.ice_cluster(standby=True)``, ``local.local_bootstrap(ice_standby=True)``,
``stack.render_envoy_config(standby_clusters=...)``), then real Envoy with two ``ice serve``:
every request is judged by the first until it is SIGKILLed, then by the second.
"""

from __future__ import annotations

import datetime
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab.stack import Stack, free_port, render_envoy_config
from ext_proc.tools.envoygen import cluster_parts, pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.local import local_bootstrap
from ext_proc.tools.envoygen.spec import load_spec
from tests.e2e.harness import (
    CHAT,
    E2E,
    ENVOY_TEMPLATE,
    PROBE,
    PROBE_HEADERS,
    metric_samples,
    request,
    write_policy,
)

REPO = Path(__file__).resolve().parents[2]
ADDRESSES = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]


def ports_by_priority(cluster: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """(priority, [port of each endpoint]) of each locality, in order."""
    return [
        (
            loc.get("priority", 0),
            [e["endpoint"]["address"]["socket_address"]["port_value"] for e in loc["lb_endpoints"]],
        )
        for loc in cluster["load_assignment"]["endpoints"]
    ]


def hosts_by_priority(cluster: dict[str, Any]) -> list[tuple[int, list[str]]]:
    return [
        (
            loc.get("priority", 0),
            [
                "{address}:{port_value}".format(**e["endpoint"]["address"]["socket_address"])
                for e in loc["lb_endpoints"]
            ],
        )
        for loc in cluster["load_assignment"]["endpoints"]
    ]


# --- the generator ----------------------------------------------------------------------------


@pytest.mark.parametrize("dns", [False, True], ids=["static", "strict_dns"])
def test_standby_gives_one_priority_per_address_in_order(dns: bool) -> None:
    cluster = as_dict(pieces.ice_cluster("ice", ADDRESSES, dns=dns, standby=True))
    assert hosts_by_priority(cluster) == [(i, [a]) for i, a in enumerate(ADDRESSES)]
    assert cluster["type"] == ("STRICT_DNS" if dns else "STATIC")


def test_standby_health_checks_fail_over_within_about_a_second() -> None:
    cluster = as_dict(pieces.ice_cluster("ice", ADDRESSES, standby=True))
    (hc,) = cluster["health_checks"]
    assert hc == {
        "timeout": "1s",
        "interval": "0.500s",
        "unhealthy_threshold": 1,
        "healthy_threshold": 2,
        "no_traffic_interval": "0.500s",  # an Envoy that has carried no request yet too
        "grpc_health_check": {},
    }
    # Detection: a crashed ICE fails the next check (≤ interval), a hung one after the timeout.
    detection = cluster_parts.STANDBY_HEALTH_INTERVAL + cluster_parts.STANDBY_HEALTH_TIMEOUT
    assert detection <= datetime.timedelta(seconds=1.5)
    # Panic threshold 0: no stream to an unhealthy ICE, even when every level is unhealthy.
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {}}
    # Envoy's default overprovisioning factor (1.4): with one host a level, all or nothing.
    assert "policy" not in cluster["load_assignment"]
    # Everything else is the plain cluster's.
    plain = as_dict(pieces.ice_cluster("ice", ADDRESSES))
    for key in ("connect_timeout", "typed_extension_protocol_options", "type", "name"):
        assert cluster[key] == plain[key], key


def test_without_standby_one_level_and_the_same_fast_checks_with_two_misses() -> None:
    cluster = as_dict(pieces.ice_cluster("ice", ADDRESSES))
    assert hosts_by_priority(cluster) == [(0, ADDRESSES)]  # one level: round robin
    (hc,) = cluster["health_checks"]
    assert hc == {
        "timeout": "1s",
        "interval": "0.500s",
        "unhealthy_threshold": 2,  # a busy event loop is not taken out by one late answer
        "healthy_threshold": 2,
        "no_traffic_interval": "0.500s",  # ext_proc streams are not traffic to Envoy's checks
        "grpc_health_check": {},
    }
    # a dead replica (refused at once) is out after two checks, ≤ 1 s without traffic
    assert (
        datetime.timedelta(seconds=1)
        >= cluster_parts.UNHEALTHY_THRESHOLD * cluster_parts.HEALTH_INTERVAL
    )
    # no panic routing either: with every replica flagged (a hang) Envoy fails open at once,
    # rather than sending every stream to a hung ICE for the late guard to refuse
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {}}


@pytest.mark.parametrize("standby", [False, True], ids=["active-active", "standby"])
def test_every_ice_cluster_ejects_a_replica_on_its_first_refused_connection(
    standby: bool,
) -> None:
    cluster = as_dict(pieces.ice_cluster("ice", ADDRESSES, standby=standby))
    assert cluster["outlier_detection"] == {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 1,
        "enforcing_consecutive_local_origin_failure": 100,
        "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_local_origin_success_rate": 0,
        "interval": "1s",
        "base_ejection_time": "5s",
        "max_ejection_time": "30s",
        "max_ejection_percent": 50,
    }


def test_a_stream_refused_by_a_dead_replica_is_opened_on_another() -> None:
    service = as_dict(pieces.ext_proc_config("ice"))["grpc_service"]
    assert service["envoy_grpc"] == {"cluster_name": "ice"}
    policy = service["retry_policy"]
    # only failures before the stream exists: a stream ICE answered on is never sent twice
    assert policy["retry_on"] == "connect-failure,refused-stream,reset-before-request"
    assert policy["num_retries"] == 2
    assert policy["retry_back_off"] == {"base_interval": "0.005s", "max_interval": "0.020s"}
    (predicate,) = policy["retry_host_predicate"]
    assert predicate["name"] == "envoy.retry_host_predicates.previous_hosts"


def test_local_bootstrap_puts_ices_addresses_in_priority_levels() -> None:
    spec = load_spec(REPO / "envoy" / "mesh.yaml")
    clusters = {
        c["name"]: c
        for c in local_bootstrap(spec, ice=ADDRESSES[:2], ice_standby=True)["static_resources"][
            "clusters"
        ]
    }
    assert hosts_by_priority(clusters["ice"]) == [(0, ADDRESSES[:1]), (1, ADDRESSES[1:2])]
    default = {c["name"]: c for c in local_bootstrap(spec)["static_resources"]["clusters"]}
    assert hosts_by_priority(default["ice"]) == [(0, ["127.0.0.1:50051"])]
    assert clusters["backend"] == default["backend"]


def test_render_envoy_config_renders_a_standby_cluster_and_leaves_the_rest() -> None:
    clusters = {"ice": ["127.0.0.1:7001", "127.0.0.1:7002"], "backend": ["127.0.0.1:8001"]}
    plain = render_envoy_config(
        ENVOY_TEMPLATE, admin_port=1, listeners={"ingress": 2}, clusters=clusters
    )
    standby = render_envoy_config(
        ENVOY_TEMPLATE,
        admin_port=1,
        listeners={"ingress": 2},
        clusters=clusters,
        standby_clusters={"ice"},
    )
    by_name = {c["name"]: c for c in standby["static_resources"]["clusters"]}
    plain_by_name = {c["name"]: c for c in plain["static_resources"]["clusters"]}
    assert ports_by_priority(plain_by_name["ice"]) == [(0, [7001, 7002])]
    assert ports_by_priority(by_name["ice"]) == [(0, [7001]), (1, [7002])]
    shaped = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"], standby=True))
    assert by_name["ice"]["health_checks"] == shaped["health_checks"]
    assert by_name["ice"]["common_lb_config"] == shaped["common_lb_config"]
    assert by_name["backend"] == plain_by_name["backend"]
    assert standby["static_resources"]["listeners"] == plain["static_resources"]["listeners"]
    with pytest.raises(ValueError, match="standby"):
        render_envoy_config(
            ENVOY_TEMPLATE, admin_port=1, listeners={}, clusters={}, standby_clusters={"ice"}
        )


# --- real Envoy, two ICE ------------------------------------------------------------------------


def decisions(metrics_port: int) -> float:
    """ICE's ``ice_decisions_total``, all labels."""
    reply = request(metrics_port, "GET", "/metrics", timeout_s=5)
    assert reply.status == 200
    return sum(
        v for name, _, v in metric_samples(reply.body.decode()) if name == "ice_decisions_total"
    )


def test_envoy_sends_every_stream_to_the_active_and_fails_over_when_it_dies(
    tmp_path: Path,
) -> None:
    with Stack(tmp_path) as stack:
        backend_port = free_port()
        stack.start_backend(backend_port)
        policy = write_policy(tmp_path / "policy.yaml", backend_port)
        ice = {name: (f"127.0.0.1:{free_port()}", free_port()) for name in ("ice-a", "ice-b")}
        for name, (address, metrics_port) in ice.items():
            stack.start_ice(
                address, policy=policy, metrics_address=f"127.0.0.1:{metrics_port}", name=name
            )
        (active, active_metrics), (standby, standby_metrics) = ice["ice-a"], ice["ice-b"]
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_TEMPLATE,
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [active, standby], "backend": [f"127.0.0.1:{backend_port}"]},
            standby_clusters={"ice"},
        )
        stack.start_envoy(config, admin_port)
        e2e = E2E(
            stack=stack,
            workdir=tmp_path,
            envoy_port=envoy_port,
            admin_port=admin_port,
            backend_port=backend_port,
            ice_addresses=[active, standby],
            ice_metrics_port=active_metrics,
        )
        hosts = e2e.envoy_host_stats("ice")
        assert {h: hosts[h]["priority"] for h in (active, standby)} == {active: "0", standby: "1"}
        e2e.wait_pressure("low")  # ICE judges (the active scraped the backend)

        before = {
            a: decisions(m) for a, m in ((active, active_metrics), (standby, standby_metrics))
        }
        sent = 20
        for _ in range(sent):
            reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
            assert reply.status == 200
            assert reply.header("x-ice-decision") == "pass", reply
        assert decisions(active_metrics) - before[active] == sent, "the active judged them all"
        assert decisions(standby_metrics) == before[standby], "the standby judged none"
        hosts = e2e.envoy_host_stats("ice")
        assert int(hosts[standby]["rq_total"]) == 0, "not one stream went to the standby"

        assert stack.stop("ice-a", signal.SIGKILL) == -signal.SIGKILL
        killed = time.monotonic()
        replies = []
        while True:  # every request is served: judged by the standby, or passed (fail-open)
            reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
            replies.append(reply)
            assert reply.status == 200, reply
            if reply.header("x-ice-decision") == "pass" and decisions(standby_metrics) > 0:
                break
            assert time.monotonic() - killed < 10, (
                f"no request judged by the standby 10 s after the kill:\n{stack.log_tails()}"
            )
            time.sleep(0.05)
        judged = decisions(standby_metrics)
        for _ in range(10):  # from now on the standby judges every request
            reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
            assert reply.status == 200 and reply.header("x-ice-decision") == "pass", reply
        assert decisions(standby_metrics) == judged + 10
        # out: ejected on its first refused stream, or failed by the health checks
        flags = e2e.envoy_host_stats("ice")[active]["health_flags"]
        assert "failed_outlier_check" in flags or "failed_active_hc" in flags, flags
