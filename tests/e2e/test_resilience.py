"""ICE never takes the service down: fail-open when it is gone, graceful drain, several workers.

Each test runs its own stack (it stops or kills ICE), so the shared one is left alone.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

from ext_proc.lab.stack import wait_grpc_health

from .harness import CHAT, E2E, PROBE, PROBE_HEADERS, Load, Sent, request, running_stack

BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999}
SPOOFED = {"x-ice-decision": "pass", "x-mem-pressure": "low", "x-downgraded": "true"}


def envoy_stat(e2e: E2E, name: str) -> int:
    reply = request(e2e.admin_port, "GET", f"/stats?filter=^{re.escape(name)}$")
    for line in reply.body.decode().splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise AssertionError(f"no Envoy stat {name}: {reply.body!r}")


def assert_all_served(sent: list[Sent]) -> None:
    failed = [s for s in sent if s.reply is None or s.reply.status != 200]
    assert not failed, failed[:5]
    for s in sent:
        assert s.reply is not None
        assert s.reply.json()["object"] == "chat.completion"


def test_requests_pass_unjudged_when_ice_never_started(tmp_path: Path) -> None:
    with running_stack(tmp_path, start_ice=False) as e2e:
        allowed = envoy_stat(e2e, "http.ingress.ext_proc.failure_mode_allowed")
        for _ in range(5):
            reply = e2e.post(CHAT, BODY, SPOOFED)
            assert reply.status == 200, reply
            assert reply.ice_headers() == {}
        got = e2e.received()
        assert len(got) == 5
        for rec in got:
            assert rec.ice_headers() == {}  # the spoofed ones are gone too (Envoy strips them)
            assert rec.json() == BODY
        assert envoy_stat(e2e, "http.ingress.ext_proc.failure_mode_allowed") >= allowed + 5


def test_requests_keep_passing_when_ice_is_killed(tmp_path: Path) -> None:
    with running_stack(tmp_path) as e2e:
        with Load(e2e, CHAT, BODY, SPOOFED) as load:
            load.wait_for(15)
            kill_started = time.time()
            assert e2e.stack.stop("ice", signal.SIGKILL) == -signal.SIGKILL
            killed = time.time()
            load.wait_for(25)
        assert_all_served(load.sent)
        before = [s for s in load.sent if s.ended < kill_started]
        after = [s for s in load.sent if s.started > killed]
        assert len(before) >= 10
        assert len(after) >= 20
        for s in before:
            assert s.reply is not None
            assert s.reply.header("x-ice-decision") == "downgrade"
        for s in after:
            assert s.reply is not None
            assert s.reply.ice_headers() == {}
        got = e2e.received()
        assert len(got) == len(load.sent)  # each request reached the backend exactly once
        late = [r for r in got if r.time > killed]
        assert len(late) >= 20
        for rec in late:
            assert rec.ice_headers() == {}
            assert rec.json() == BODY  # unjudged: the limit is the client's


def test_sigterm_drains_an_open_stream_then_exits_zero(tmp_path: Path) -> None:
    """A request whose ext_proc stream is open at SIGTERM is still judged; ICE then exits 0."""
    grace_s = 3.0
    with running_stack(tmp_path, ice_extra=["--shutdown-grace-s", str(grace_s)]) as e2e:
        body = b'{"model": "dev-model", "messages": [{"role": "user", "content": "hi"}],'
        rest = b' "max_tokens": 99999}'
        head = (
            f"POST {CHAT} HTTP/1.1\r\nhost: e2e\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body) + len(rest)}\r\n\r\n"
        ).encode()
        ice = e2e.stack.procs["ice"]
        with socket.create_connection(("127.0.0.1", e2e.envoy_port), timeout=15) as sock:
            sock.sendall(head + body)  # ICE has judged the headers and waits for the body
            time.sleep(0.3)
            os.killpg(ice.pid, signal.SIGTERM)
            time.sleep(0.5)
            assert ice.poll() is None  # still draining the open stream
            sock.sendall(rest)
            raw = b""
            while b"\r\n\r\n" not in raw or not raw.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                raw += chunk
        assert raw.startswith(b"HTTP/1.1 200"), raw
        assert b"x-ice-decision: downgrade" in raw
        assert ice.wait(grace_s + 10) == 0
        assert e2e.post(CHAT, BODY).status == 200  # and afterwards: fail-open


def test_requests_keep_passing_through_a_graceful_shutdown(tmp_path: Path) -> None:
    grace_s = 2.0
    with running_stack(tmp_path, ice_extra=["--shutdown-grace-s", str(grace_s)]) as e2e:
        with Load(e2e, CHAT, BODY, {}) as load:
            load.wait_for(10)
            # Stack.stop SIGKILLs after the timeout, so 0 means ICE exited by itself, in time.
            assert e2e.stack.stop("ice", signal.SIGTERM, timeout_s=grace_s + 10) == 0
            stopped = time.time()
            load.wait_for(30)  # a few of these started before the stop
        assert_all_served(load.sent)
        after = [s for s in load.sent if s.started > stopped]
        assert len(after) >= 20
        assert all(s.reply is not None and s.reply.ice_headers() == {} for s in after)


def worker_pid(e2e: E2E, address: str) -> int:
    """The pid of the ICE worker serving ``address``, from its start-up line in ICE's log."""
    found = re.findall(
        rf"ice worker (\d+) serving ext_proc on {re.escape(address)}\n", ice_log(e2e)
    )
    assert found, ice_log(e2e)
    return int(found[-1])


def ice_log(e2e: E2E) -> str:
    return e2e.stack.logs["ice"].read_text()


def test_two_workers_share_the_streams_and_survive_losing_one(tmp_path: Path) -> None:
    with running_stack(tmp_path, workers=2) as e2e:
        hosts = e2e.ice_addresses
        assert len(hosts) == 2
        stats = e2e.envoy_host_stats("ice")
        assert {h: stats[h]["health_flags"] for h in hosts} == dict.fromkeys(hosts, "healthy")
        before = {h: int(stats[h]["rq_total"]) for h in hosts}
        for _ in range(20):
            reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
            assert reply.status == 200
            assert reply.header("x-ice-decision") == "pass"
            assert reply.header("x-mem-pressure") == "low"
        stats = e2e.envoy_host_stats("ice")
        served = {h: int(stats[h]["rq_total"]) - before[h] for h in hosts}
        assert all(n >= 5 for n in served.values()), served  # round robin: about 10 each
        assert e2e.ice_metric("ice_decisions_total", route="chat") >= 20  # both workers' counts

        # Lose one worker: requests still succeed, and the supervisor starts a new one.
        victim = worker_pid(e2e, hosts[0])
        with Load(e2e, CHAT, BODY, {}) as load:
            load.wait_for(5)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while worker_pid(e2e, hosts[0]) == victim:  # the replacement's start-up line
                assert time.monotonic() < deadline, ice_log(e2e)
                time.sleep(0.1)
            wait_grpc_health(hosts[0], timeout_s=30)
            load.wait_for(10)
        assert_all_served(load.sent)
        assert e2e.stack.stop("ice", signal.SIGTERM, timeout_s=20) == 0


def test_sighup_never_stops_ice_and_sigint_drains_like_sigterm(tmp_path: Path) -> None:
    with running_stack(tmp_path, workers=2) as e2e:
        ice = e2e.stack.procs["ice"]
        os.killpg(ice.pid, signal.SIGHUP)  # the supervisor and both workers get it
        time.sleep(1.0)  # a reload of an unchanged file: nothing to do (test_reload.py)
        assert ice.poll() is None
        assert "refused" not in ice_log(e2e)
        for address in e2e.ice_addresses:
            wait_grpc_health(address, timeout_s=5)
        for _ in range(4):
            reply = e2e.post(CHAT, BODY, {})
            assert reply.status == 200 and reply.header("x-ice-decision") == "downgrade"
        assert e2e.stack.stop("ice", signal.SIGINT, timeout_s=20) == 0
