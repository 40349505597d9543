"""A backend's own overload 503 (vLLM 0.32's admission valve, imitated by the dev backend's
``valve``) reaches the client as ICE's answer, through real Envoy and ICE
(``ext_proc.admit.overload_answer``): the status (503, or 429 where the profile maps it),
Retry-After, the verdict headers and the API's error body; Envoy's own 503 and a fault in
ICE's response phase leave the response as it was; a pool of two endpoints retries the 503 on
the other one (the generated configuration's route retry policy).

Requests are sent with ``x-priority: critical``: ICE never sheds them, so each reaches the
backend even when the valve's rejections raise the pool's pressure (``ext_proc.signals``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.lab.devbackend.answers import VALVE_MESSAGES
from ext_proc.lab.stack import Stack, free_port, render_envoy_config
from ext_proc.tools.envoygen.cli import render_all

from .harness import (
    CHAT,
    E2E,
    IDLE,
    MESSAGES,
    RETRY_AFTER_S,
    VALVE_STRAINED,
    Reply,
    request,
    running_stack,
)

CRITICAL = {"x-priority": "critical"}
CHAT_BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
MESSAGES_BODY = {
    "model": "dev-model",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}
LEVELS = ("low", "medium", "high", "critical", "unknown")
APIS = [(CHAT, CHAT_BODY, False), (MESSAGES, MESSAGES_BODY, True)]
API_IDS = ["openai-chat", "anthropic-messages"]
REPO = Path(__file__).resolve().parents[2]


def _error(reply: Reply, anthropic: bool) -> dict[str, Any]:
    doc = reply.json()
    if anthropic:
        assert doc["type"] == "error", doc
    err: dict[str, Any] = doc["error"]
    assert err["code"] == "backend_overloaded", doc
    assert "admission limit" in err["message"], doc
    return err


def _ices_answer(reply: Reply, status: int) -> None:
    assert reply.status == status, reply
    assert reply.header("retry-after") == str(RETRY_AFTER_S)  # the test policy pins 2 s
    assert reply.headers_named("x-ice-decision") == ["reject"]  # one verdict: not the pass too
    assert reply.header("x-ice-reason") == "backend_overloaded"
    assert reply.header("x-mem-pressure") in LEVELS
    assert reply.header("content-type") == "application/json"


@pytest.mark.parametrize(("path", "body", "anthropic"), APIS, ids=API_IDS)
def test_a_backends_valve_503_reaches_the_client_as_ices_503(
    stack: E2E, path: str, body: dict[str, Any], anthropic: bool
) -> None:
    route = "messages" if anthropic else "chat"
    before = stack.ice_metric("ice_backend_overloads_total", route=route, status="503")
    stack.shut_valve()
    reply = stack.post(path, body, CRITICAL)
    _ices_answer(reply, 503)
    err = _error(reply, anthropic)
    assert err["type"] == ("overloaded_error" if anthropic else "server_error")
    # the backend got it (and refused it) once: one endpoint, no retry
    assert len(stack.received()) == 1
    after = stack.ice_metric("ice_backend_overloads_total", route=route, status="503")
    assert after == before + 1


def _response_phases(e2e: E2E) -> float:
    return e2e.ice_metric("ice_processing_seconds_count", phase="response_headers")


def test_the_backends_other_answers_are_left_alone_at_one_message_each(stack: E2E) -> None:
    stack.reset()
    stack.set_state(VALVE_STRAINED, level="medium")  # strained: the response headers are asked
    before = _response_phases(stack)
    reply = stack.post(CHAT, CHAT_BODY, CRITICAL)
    assert reply.status == 200, reply
    assert reply.json()["object"] == "chat.completion"
    assert reply.header("x-ice-decision") == "pass" and reply.header("retry-after") is None
    assert _response_phases(stack) == before + 1  # the one message more a passed request costs
    bad = stack.post(CHAT, {"model": "dev-model", "messages": "nope"}, CRITICAL)
    assert bad.status == 400  # ICE's own answer at the body: Envoy sends no response phase
    assert _response_phases(stack) == before + 1


def test_an_idle_pool_costs_no_response_phase(tmp_path: Path) -> None:
    # a stack of its own: the module's has seen valve refusals within its window
    with running_stack(tmp_path) as e2e:
        e2e.set_state(IDLE, level="low")
        before = _response_phases(e2e)
        reply = e2e.post(CHAT, CHAT_BODY, CRITICAL)
        assert reply.status == 200 and reply.header("x-ice-decision") == "pass", reply
        assert _response_phases(e2e) == before  # low pressure, no refusals: two messages


# --- a profile that maps the 503 to 429, a fault in the response phase, Envoy's own 503 ------

# Loaded by every Python process of the stack (PYTHONPATH): wraps
# ext_proc.admit.overload_answer.respond, once ICE imports it, to raise while FLAG exists.
FAULT_HOOK = """\
import importlib.abc
import os
import sys

FLAG = {flag!r}
TARGET = "ext_proc.admit.overload_answer"


def _broken(real):
    def respond(*args, **kwargs):
        if os.path.exists(FLAG):
            raise RuntimeError("e2e: a fault in ICE's response phase")
        return real(*args, **kwargs)

    return respond


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            module.respond = _broken(module.respond)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
"""


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[E2E, Path]]:
    """A stack whose profile answers a backend's overload 503 with 429, and whose ICE breaks
    in the response phase while the yielded flag file exists."""
    workdir = tmp_path_factory.mktemp("mapped")
    hook, flag = workdir / "hook", workdir / "fault"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAULT_HOOK.format(flag=str(flag)))
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), saved) if p)
    try:
        extra = "    backend_overload_status: 429\n"
        with running_stack(workdir, profile_extra=extra) as e2e:
            yield e2e, flag
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.mark.parametrize(("path", "body", "anthropic"), APIS, ids=API_IDS)
def test_the_profile_maps_the_503_to_429(
    mapped: tuple[E2E, Path], path: str, body: dict[str, Any], anthropic: bool
) -> None:
    e2e, _ = mapped
    e2e.reset()
    e2e.shut_valve("max_num_queued_tokens")
    reply = e2e.post(path, body, CRITICAL)
    _ices_answer(reply, 429)
    assert _error(reply, anthropic)["type"] == "rate_limit_error"


def test_a_fault_in_the_response_phase_leaves_the_response_as_it_was(
    mapped: tuple[E2E, Path],
) -> None:
    e2e, flag = mapped
    e2e.reset()
    faults = e2e.ice_metric("ice_internal_errors_total", phase="response_headers")
    e2e.shut_valve()
    flag.touch()
    try:
        reply = e2e.post(CHAT, CHAT_BODY, CRITICAL)
    finally:
        flag.unlink()
    assert reply.status == 503, reply  # vLLM's own answer, byte for byte, not mapped to 429
    assert reply.json() == {
        "error": {
            "message": VALVE_MESSAGES["max_num_queued_reqs"],
            "type": "Service Unavailable",
            "param": None,
            "code": 503,
        }
    }
    assert reply.header("retry-after") is None
    assert reply.header("x-ice-decision") == "pass"  # the request's verdict, as before
    after = e2e.ice_metric("ice_internal_errors_total", phase="response_headers")
    assert after == faults + 1


def test_envoys_own_503_is_not_rewritten(mapped: tuple[E2E, Path]) -> None:
    """Last in this module: it stops the backend. Envoy's 503 (the connection refused, once
    retried) is a local reply: ICE sees it in the response phase and leaves it (a rewrite
    would have made it a 429 here)."""
    e2e, _ = mapped
    e2e.reset()
    faults = e2e.ice_metric("ice_internal_errors_total", phase="response_headers")
    e2e.stack.stop("backend")
    reply = e2e.post(CHAT, CHAT_BODY, CRITICAL)
    assert reply.status == 503, reply
    assert reply.header("content-type") == "text/plain"
    assert b"upstream connect error" in reply.body
    assert reply.header("retry-after") is None
    assert reply.header("x-ice-decision") == "pass"
    assert e2e.ice_metric("ice_internal_errors_total", phase="response_headers") == faults


# --- a pool of two endpoints: the 503 is retried on the other -----------------------------

# client_priority: trust: the requests' x-priority: critical must be believed (never shed).
POOL_POLICY = """\
profiles:
  default: {{max_model_len: 8192, output_buffer_tokens: 512, client_priority: trust}}
pools:
  default:
    metrics_urls: [{urls}]
    scrape_interval_s: 0.1
    scrape_timeout_s: 0.5
    max_age_s: 2.0
routes:
  chat: {{profile: default, pool: default}}
  messages: {{profile: default, pool: default}}
"""


def test_a_pool_of_two_endpoints_retries_the_503_on_the_other(tmp_path: Path) -> None:
    with Stack(tmp_path) as stack:
        ports = {"shut": free_port(), "open": free_port()}
        for name, port in ports.items():
            stack.start_backend(port, name=name)
        urls = ", ".join(f'"http://127.0.0.1:{p}/metrics"' for p in ports.values())
        policy = tmp_path / "policy.yaml"
        policy.write_text(POOL_POLICY.format(urls=urls))
        spec = yaml.safe_load((REPO / "envoy" / "mesh.yaml").read_text())
        spec["policy"] = str(policy)
        spec["routes"] = [r for r in spec["routes"] if r["name"] in ("chat", "messages")]
        (tmp_path / "mesh.yaml").write_text(yaml.safe_dump(spec))
        template = tmp_path / "envoy.yaml"
        template.write_text(render_all(tmp_path / "mesh.yaml")["envoy.yaml"])
        ice = f"127.0.0.1:{free_port()}"
        stack.start_ice(ice, policy=policy)
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            template,
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [ice], "backend": [f"127.0.0.1:{p}" for p in ports.values()]},
        )
        stack.start_envoy(config, admin_port)
        put = json.dumps({"valve": "max_num_queued_reqs"}).encode()
        assert request(ports["shut"], "PUT", "/_dev/state", put).status == 200
        time.sleep(0.5)  # ICE's first views of both
        sent = json.dumps(CHAT_BODY).encode()
        headers = {"content-type": "application/json", **CRITICAL}
        replies = [request(envoy_port, "POST", CHAT, sent, headers) for _ in range(6)]
        assert [r.status for r in replies] == [200] * 6, replies
        assert all(r.header("x-ice-decision") == "pass" for r in replies)

        def served(name: str) -> int:
            got = request(ports[name], "GET", "/_dev/requests").json()
            return sum(1 for r in got if r["path"] == CHAT)

        # round robin sent some to the shut one first; each was retried on the open one
        assert served("shut") >= 1
        assert served("open") == 6
