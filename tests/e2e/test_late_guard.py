"""Issue 44, class 4, through real Envoy: a request ICE did not judge in time never reaches the
backend as if judged.

Under a flood on a loaded machine Envoy's ext_proc timer fired on requests' *headers*
messages before ICE had received them (docs/flood.md), and ``failure_mode_allow`` sent the
requests on unjudged: up to 398 of 512. A relay between Envoy and ICE that holds every byte
Envoy writes for 1.5 s (``SlowLink(hold_s=...)``) makes exactly that happen to one request:
ICE is up and answers, after Envoy's 1 s. Before the late guard
(``ext_proc.tools.envoygen.late_guard``) the request reached the backend with a 200 and no
verdict; now Envoy answers it 429 ``ice_late``, counts and logs it. With ICE down the request
still goes on unjudged (fail-open).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import CHAT, E2E, MESSAGES, access_log_entry, running_stack
from .slowlink import SlowLink

BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
HOLD_S = 1.5  # past the shipped message_timeout (1 s)


def envoy_stat(e2e: E2E, name: str) -> int:
    url = f"http://127.0.0.1:{e2e.admin_port}/stats?filter=^{name}$"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(int(line.rpartition(": ")[2]) for line in text.splitlines() if ": " in line)


@pytest.fixture
def held_link_stack(tmp_path: Path) -> Iterator[tuple[E2E, list[SlowLink]]]:
    links: list[SlowLink] = []

    def link(address: str) -> str:
        links.append(SlowLink(address, float("inf")))
        return links[-1].address

    try:
        with running_stack(tmp_path, ice_link=link) as e2e:
            yield e2e, links
    finally:
        for one in links:
            one.close()


def test_a_request_whose_headers_reach_ice_too_late_is_refused_not_sent_on(
    held_link_stack: tuple[E2E, list[SlowLink]],
) -> None:
    e2e, links = held_link_stack
    assert e2e.post(CHAT, BODY).header("x-ice-decision") == "pass"  # the link, not held
    e2e.clear_received()
    for one in links:
        one.hold_s = HOLD_S
    for path, error in ((CHAT + "?late", "error"), (MESSAGES + "?late", "error")):
        reply = e2e.post(path, BODY)
        assert reply.status == 429, (reply.status, reply.ice_headers(), e2e.log_tails(30))
        assert reply.header("x-ice-decision") == "reject"
        assert reply.header("x-ice-reason") == "ice_late"
        assert reply.header("retry-after") == "1"
        assert reply.json()[error]["code"] == "ice_late"
    assert reply.json()["type"] == "error"  # Anthropic's format on /v1/messages
    assert not e2e.received(), "a request ICE did not judge in time reached the backend"
    entry = access_log_entry(e2e, CHAT + "?late")
    assert entry["details"] == "rbac_access_denied_matched_policy[ice_late]", entry
    assert entry["ext_proc_headers_status"] == "4", entry  # Envoy's timer fired
    assert entry["ext_proc_failed_open"] == "1", entry  # the filter gave up; the guard refused
    assert envoy_stat(e2e, "http.ingress.rbac.ice_late.denied") == 2


def test_with_ice_down_requests_still_fail_open(
    held_link_stack: tuple[E2E, list[SlowLink]],
) -> None:
    e2e, _ = held_link_stack
    e2e.stack.stop("ice")
    time.sleep(1)
    reply = e2e.post(CHAT + "?down", BODY)
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.header("x-ice-decision") is None  # unjudged, as failure_mode_allow says
    assert [json.loads(r.body) for r in e2e.received()][-1]["max_tokens"] == 8
    entry = access_log_entry(e2e, CHAT + "?down")
    assert entry["ext_proc_failed_open"] == "1", entry
    # UNAVAILABLE (14), not late: on the headers' call, or before it (no healthy ICE)
    assert entry["ext_proc_headers_status"] in ("14", None), entry
    assert envoy_stat(e2e, "http.ingress.rbac.ice_late.denied") == 0


def ice_flagged(e2e: E2E) -> bool:
    url = f"http://127.0.0.1:{e2e.admin_port}/clusters"
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return any(
        line.startswith("ice::") and "health_flags::" in line and "failed_active_hc" in line
        for line in lines
    )


def test_a_hung_ice_is_late_until_envoy_flags_it_then_fails_open(tmp_path: Path) -> None:
    """SIGSTOP: ICE's connections stay open and nothing answers. What Envoy sends it before
    its health checks flag it is late (429 ``ice_late``, not unjudged); once flagged, no
    panic mode: Envoy sends ICE no stream and fails open at once (it used to send every
    stream to the hung ICE, which the guard would refuse for as long as the hang lasts)."""
    with running_stack(tmp_path) as e2e:
        group = os.getpgid(e2e.stack.procs["ice"].pid)
        os.killpg(group, signal.SIGSTOP)
        try:
            reply = e2e.post(CHAT + "?hung", BODY)
            assert reply.status == 429 and reply.header("x-ice-reason") == "ice_late", (
                reply.status,
                reply.ice_headers(),
            )
            deadline = time.monotonic() + 10
            while not ice_flagged(e2e):
                assert time.monotonic() < deadline, "Envoy never flagged the hung ICE"
                time.sleep(0.2)
            reply = e2e.post(CHAT + "?flagged", BODY)
        finally:
            os.killpg(group, signal.SIGCONT)
        assert reply.status == 200 and reply.header("x-ice-decision") is None, reply.status
        # no stream went to ICE (no healthy host: no call, no message timeout waited)
        entry = access_log_entry(e2e, CHAT + "?flagged")
        assert entry["ext_proc_failed_open"] == "1", entry
        assert entry["ext_proc_headers_status"] is None, entry
