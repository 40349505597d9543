"""Active-active ICE replicas behind real Envoy (the generated cluster, both at one priority):
one SIGKILLed under steady traffic leaves at most a second in which a request passes
unjudged (the ext_proc stream refused by the dead replica is opened on the other; outlier
detection ejects it; the health checks apply without traffic), the replica restarted takes
traffic again within 2 s, and Envoy started before ICE sees it healthy within 2 s."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from ext_proc.lab.stack import Stack, free_port, render_envoy_config
from ext_proc.tools.doctor import main
from tests.e2e.harness import (
    CHAT,
    ENVOY_TEMPLATE,
    PROBE,
    PROBE_HEADERS,
    metric_samples,
    request,
    write_policy,
)

BODY = json.dumps(PROBE).encode()
HEADERS = {"content-type": "application/json", **PROBE_HEADERS}


def judged(metrics_port: int) -> float:
    """A replica's judged bodies (``ice_decisions_total``, all labels)."""
    reply = request(metrics_port, "GET", "/metrics", timeout_s=5)
    assert reply.status == 200
    return sum(
        v for name, _, v in metric_samples(reply.body.decode()) if name == "ice_decisions_total"
    )


def healthy(admin_port: int, address: str) -> bool:
    """Envoy's view of ``address`` in cluster ``ice``: no failure flag."""
    reply = request(admin_port, "GET", "/clusters")
    for line in reply.body.decode().splitlines():
        parts = line.split("::")
        if parts[:3] == ["ice", address, "health_flags"]:
            return parts[3] == "healthy"
    return False


class Load:
    """Sequential requests from ``clients`` threads; each reply: (time, judged)."""

    def __init__(self, envoy_port: int, clients: int = 2) -> None:
        self.envoy_port = envoy_port
        self.replies: list[tuple[float, bool, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            reply = request(self.envoy_port, "POST", CHAT, BODY, HEADERS, timeout_s=10)
            done = time.monotonic()
            self.replies.append((done, reply.header("x-ice-decision") is not None, reply.status))
            time.sleep(0.02)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


BACK_WITHIN_S = 4.0  # a restarted replica's helper start, then Envoy's two passing checks


def test_a_killed_replica_leaves_at_most_a_second_unjudged_and_comes_back_within_seconds(
    tmp_path: Path,
) -> None:
    with Stack(tmp_path) as stack:
        backend_port = free_port()
        stack.start_backend(backend_port)
        policy = write_policy(tmp_path / "policy.yaml", backend_port)
        ice = [(f"127.0.0.1:{free_port()}", free_port()) for _ in range(2)]
        for i, (address, metrics_port) in enumerate(ice):
            stack.start_ice(
                address, policy=policy, metrics_address=f"127.0.0.1:{metrics_port}", name=f"ice{i}"
            )
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_TEMPLATE,
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [a for a, _ in ice], "backend": [f"127.0.0.1:{backend_port}"]},
        )
        stack.start_envoy(config, admin_port)
        (victim, victim_metrics), (_, other_metrics) = ice
        deadline = time.monotonic() + 10
        while not all(healthy(admin_port, a) for a, _ in ice):
            assert time.monotonic() < deadline, stack.log_tails()
            time.sleep(0.1)

        with Load(envoy_port) as load:
            time.sleep(1.0)
            assert judged(victim_metrics) > 0 and judged(other_metrics) > 0  # both judge
            assert stack.stop("ice0", signal.SIGKILL) == -signal.SIGKILL
            killed = time.monotonic()
            time.sleep(2.5)
            stack.start_ice(
                victim,
                policy=policy,
                metrics_address=f"127.0.0.1:{victim_metrics}",
                name="ice0-again",
            )
            back = time.monotonic()
            # since issue 44 a replica reports SERVING only once its helper process has loaded
            # the policy (~1 s here, more on a loaded machine), then Envoy's two passing
            # checks: under 2 s on 3 Dec, before that gate
            while judged(victim_metrics) == 0:
                assert time.monotonic() - back < BACK_WITHIN_S, "the restarted one took nothing"
                time.sleep(0.05)
            took = time.monotonic() - back
        after = [(t - killed, ok, status) for t, ok, status in load.replies if t >= killed]
        assert all(status == 200 for _, _, status in after), after
        unjudged = [t for t, ok, _ in after if not ok]
        assert len(after) > 50, "the load kept going"
        assert not unjudged or unjudged[-1] - unjudged[0] <= 1.0, unjudged
        assert len(unjudged) <= 2, unjudged  # at most the streams in flight at the kill
        assert took < BACK_WITHIN_S


def ice_hosts_verdict(
    admin_port: int, ice: str, policy: Path, capsys: pytest.CaptureFixture[str]
) -> set[str]:
    """``ice doctor``'s ``envoy.ice_hosts`` statuses against the Envoy at ``admin_port``."""
    capsys.readouterr()
    envoy = f"http://127.0.0.1:{admin_port}"
    main(
        ["--envoy-admin", envoy, "--ice", ice, "--policy", str(policy), "--timeout", "3", "--json"]
    )
    checks = json.loads(capsys.readouterr().out)
    return {c["status"] for c in checks if c["name"] == "envoy.ice_hosts"}


def test_envoy_started_before_ice_sees_it_healthy_within_two_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Stack(tmp_path) as stack:
        backend_port = free_port()
        stack.start_backend(backend_port)
        policy = write_policy(tmp_path / "policy.yaml", backend_port)
        address, metrics_port = f"127.0.0.1:{free_port()}", free_port()
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_TEMPLATE,
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [address], "backend": [f"127.0.0.1:{backend_port}"]},
        )
        stack.start_envoy(config, admin_port)
        # requests flow while ICE is not there yet: they pass (fail-open), Envoy checks it
        for _ in range(5):
            assert request(envoy_port, "POST", CHAT, BODY, HEADERS).status == 200
        time.sleep(1.0)
        assert not healthy(admin_port, address)
        stack.start_ice(address, policy=policy, metrics_address=f"127.0.0.1:{metrics_port}")
        serving = time.monotonic()
        # right after the start: no FAIL (a host flagged a moment longer is read again)
        verdict = ice_hosts_verdict(admin_port, address, policy, capsys)
        assert verdict and verdict <= {"PASS", "WARN"}, verdict
        while not healthy(admin_port, address):
            assert time.monotonic() - serving < BACK_WITHIN_S, stack.log_tails()
            time.sleep(0.05)
        reply = request(envoy_port, "POST", CHAT, BODY, HEADERS)
        assert reply.status == 200 and reply.header("x-ice-decision") is not None
