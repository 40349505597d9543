"""Judged where it will run: a pool of two dev backends behind real Envoy (the shipped
envoy.yaml: round robin, with the override_host policy that honours ICE's pick) and ICE, in
each ``endpoint_pick`` mode.

Backend states: FULL shows 101 blocks of 128 tokens at 92 % used (floor(100 × 0.08) = 8
free = 1,024 tokens); ROOMY shows 10,001 blocks, idle. A chat request of "hi" (about 8 input
tokens) with max_tokens 1900 needs ceil(1908 / 128) = 15 blocks: it fits ROOMY, not FULL.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab.redis_local import RedisServer
from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

from .harness import Reply, request

FULL = {"kv_cache_usage_perc": 0.92, "num_gpu_blocks": 101, "block_size": 128}
ROOMY = {"kv_cache_usage_perc": 0.0, "num_gpu_blocks": 10_001, "block_size": 128}
CHAT = "/v1/chat/completions"
BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1900}

POLICY = """\
profiles:
  default: {{max_model_len: 8192, output_buffer_tokens: 512, min_output_tokens: 16}}
pools:
  default:
    metrics_urls: [{urls}]
    scrape_interval_s: 0.1
    scrape_timeout_s: 0.5
    max_age_s: 2.0
    endpoint_pick: {mode}
{extra}routes:
  chat: {{profile: default, pool: default}}
"""


@dataclass
class Pool:
    stack: Stack
    envoy_port: int
    backends: dict[str, int]  # name → port
    dead: str = ""  # the closed address ICE may pick (dead_endpoint)

    def post(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        sent = {"content-type": "application/json", **(headers or {})}
        return request(self.envoy_port, "POST", CHAT, json.dumps(body).encode(), sent)

    def backend_call(self, name: str, method: str, path: str, body: Any = None) -> Reply:
        raw = json.dumps(body).encode() if body is not None else None
        return request(self.backends[name], method, path, raw, {})

    def received(self, name: str) -> list[dict[str, Any]]:
        import base64

        records = self.backend_call(name, "GET", "/_dev/requests").json()
        return [json.loads(base64.b64decode(r["body_b64"])) for r in records if r["path"] == CHAT]

    def clear(self) -> None:
        for name in self.backends:
            self.backend_call(name, "DELETE", "/_dev/requests")


def _wait_scrapes() -> None:
    time.sleep(0.6)  # several scrape intervals: ICE sees the states


@contextlib.contextmanager
def pool_stack(
    workdir: Path,
    mode: str,
    *,
    dead_endpoint: bool = False,
    epp_header: bool = False,
    subset_of: str = "",
    ice_extra: list[str] | None = None,
) -> Iterator[Pool]:
    """Two dev backends (FULL, ROOMY) in one pool; with ``dead_endpoint`` a third backend's
    metrics (idle) are mapped to a closed port that is also in Envoy's backend cluster."""
    with Stack(workdir) as stack:
        ports = {"full": free_port(), "roomy": free_port()}
        for name, port in ports.items():
            stack.start_backend(port, name=name)
        urls = {n: f"http://127.0.0.1:{p}/metrics" for n, p in ports.items()}
        extra = dead = ""
        cluster = [f"127.0.0.1:{p}" for p in ports.values()]
        if dead_endpoint:
            ports["ghost"] = free_port()
            stack.start_backend(ports["ghost"], name="ghost")
            urls["ghost"] = f"http://127.0.0.1:{ports['ghost']}/metrics"
            dead = f"127.0.0.1:{free_port()}"  # nothing listens there
            extra = f'    backend_endpoints: {{"{urls["ghost"]}": "{dead}"}}\n'
            cluster.append(dead)
        policy = workdir / "policy.yaml"
        text = POLICY.format(
            urls=", ".join(f'"{u}"' for u in urls.values()), mode=mode, extra=extra
        )
        policy.write_text(text)
        ice = f"127.0.0.1:{free_port()}"
        stack.start_ice(ice, policy=policy, extra=ice_extra)
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [ice], "backend": cluster},
        )
        if epp_header:  # a stand-in endpoint picker after the spoof stripping, before ICE
            filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            http = filters[0]["typed_config"]["http_filters"]
            epp = {
                "name": "test.epp",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http"
                    ".header_mutation.v3.HeaderMutation",
                    "mutations": {
                        "request_mutations": [
                            {
                                "append": {
                                    "header": {
                                        "key": "x-gateway-destination-endpoint",
                                        "value": "%REQ(x-test-epp)%",
                                    },
                                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                                }
                            }
                        ]
                    },
                },
            }
            http.insert(1, epp)
        if subset_of:  # a stand-in gateway that hints the subset: only that backend
            filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            http = filters[0]["typed_config"]["http_filters"]
            address = f"127.0.0.1:{ports[subset_of]}"
            hint = {
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata"
                    ".v3.Config",
                    "metadata": [
                        {
                            "metadata_namespace": "envoy.lb.subset_hint",
                            "value": {"x-gateway-destination-endpoint-subset": [address]},
                        }
                    ],
                },
            }
            http.insert(1, hint)
        stack.start_envoy(config, admin_port)
        p = Pool(stack, envoy_port, ports, dead if dead_endpoint else "")
        p.backend_call("full", "PUT", "/_dev/state", FULL)
        p.backend_call("roomy", "PUT", "/_dev/state", ROOMY)
        if dead_endpoint:
            p.backend_call("ghost", "PUT", "/_dev/state", ROOMY)
        _wait_scrapes()
        yield p


def blocks(body: dict[str, Any], block_size: int = 128) -> int:
    # ICE's estimate of the chat prompt: 3 + 4 + ceil(2 / 4) = 8 tokens
    return -(-(8 + int(body["max_tokens"])) // block_size)


def test_ice_mode_sends_no_request_where_it_does_not_fit(tmp_path: Path) -> None:
    with pool_stack(tmp_path, "ice") as pool:
        replies = [pool.post(BODY) for _ in range(20)]
        assert all(r.status == 200 for r in replies), replies
        assert {r.header("x-ice-endpoint") for r in replies} == {
            f"127.0.0.1:{pool.backends['roomy']}"
        }
        assert all(r.header("x-ice-decision") == "pass" for r in replies)
        assert pool.received("full") == []
        assert len(pool.received("roomy")) == 20


def test_ice_mode_on_the_shared_ledger_still_sends_every_request_where_it_fits(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # the reservation's round trip (and a re-judgement on a conflict) keeps the pick
    redis_server.client().flushdb()
    extra = ["--ledger", redis_server.url, "--ledger-deadline-ms", "100"]
    with pool_stack(tmp_path, "ice", ice_extra=extra) as pool:
        replies = [pool.post(BODY) for _ in range(20)]
        assert all(r.status == 200 for r in replies), replies
        roomy = f"127.0.0.1:{pool.backends['roomy']}"
        assert {r.header("x-ice-endpoint") for r in replies} == {roomy}
        assert pool.received("full") == []
        assert len(pool.received("roomy")) == 20
        # each reservation in the shared ledger names the endpoint ICE picked
        seen = redis_server.client().zrange("ice:{default}:seen", 0, -1)
        assert len(seen) == 20
        assert {m.decode().split("|")[2] for m in seen} == {roomy}


def test_none_mode_lets_nothing_land_un_downgraded_where_it_does_not_fit(
    tmp_path: Path,
) -> None:
    with pool_stack(tmp_path, "none") as pool:
        replies = [pool.post(BODY) for _ in range(20)]
        # judged against FULL's 8 blocks: the first is downgraded to 1024 − 8 = 1016 tokens;
        # it then holds them (anywhere), so later ones wait for a newer view or are shed
        assert replies[0].header("x-ice-decision") == "downgrade", replies[0]
        assert replies[0].header("x-ice-reason") == "kv_free_blocks"
        assert all(r.header("x-ice-decision") in ("downgrade", "reject") for r in replies)
        for sent in pool.received("full"):
            assert blocks(sent) <= 8, sent


@pytest.mark.parametrize(
    ("name", "decision", "shown"),
    [("roomy", "pass", None), ("full", "downgrade", None), ("nowhere", "downgrade", "unknown")],
    ids=["roomy-named", "full-named", "unknown-named"],
)
def test_header_mode_judges_against_the_endpoint_another_picker_named(
    tmp_path: Path, name: str, decision: str, shown: str | None
) -> None:
    with pool_stack(tmp_path, "header", epp_header=True) as pool:
        named = f"127.0.0.1:{pool.backends.get(name, 1)}"
        reply = pool.post(BODY, {"x-test-epp": named})
        assert reply.status == 200, reply
        assert reply.header("x-ice-decision") == decision
        assert reply.header("x-ice-endpoint") == (shown or named)


def test_a_picked_endpoint_that_refuses_connections_is_retried_on_another(
    tmp_path: Path,
) -> None:
    with pool_stack(tmp_path, "ice", dead_endpoint=True) as pool:
        # ICE prefers the dead address sometimes (its metrics say idle, 10,000 blocks);
        # Envoy retries a failed connection once on another endpoint
        replies = [pool.post({**BODY, "max_tokens": 100}) for _ in range(12)]
        assert all(r.status == 200 for r in replies), [r.status for r in replies]
        picked = [r.header("x-ice-endpoint") for r in replies]
        assert pool.dead in picked  # the pick alternates between the two idle-looking ones
        assert len(pool.received("full")) + len(pool.received("roomy")) == 12


def test_ice_killed_under_load_fails_open_to_round_robin_without_a_loop(
    tmp_path: Path,
) -> None:
    import threading

    with pool_stack(tmp_path, "ice") as pool:
        replies: list[Reply] = []
        errors: list[str] = []
        stop = threading.Event()

        def load() -> None:  # four clients sending one request after another
            while not stop.is_set():
                try:
                    replies.append(pool.post(BODY))
                except OSError as e:
                    errors.append(repr(e))
                time.sleep(0.05)  # the dev backend keeps its last 1,000 requests

        clients = [threading.Thread(target=load) for _ in range(4)]
        for c in clients:
            c.start()
        time.sleep(1.5)
        pool.stack.stop("ice", signal.SIGKILL)  # mid-flight
        time.sleep(2.0)
        stop.set()
        for c in clients:
            c.join(10)
        assert errors == []
        assert replies and all(r.status == 200 for r in replies), [r.status for r in replies]
        judged = [r for r in replies if r.header("x-ice-decision") is not None]
        unjudged = [r for r in replies if r.header("x-ice-decision") is None]
        assert judged and unjudged  # ICE judged before the kill, Envoy failed open after
        # every request reached a backend once: none went back into Envoy
        assert len(pool.received("full")) + len(pool.received("roomy")) == len(replies)
        pool.clear()
        after = [pool.post(BODY) for _ in range(10)]
        assert [r.status for r in after] == [200] * 10
        assert (len(pool.received("full")), len(pool.received("roomy"))) == (5, 5)  # round robin


def test_ice_mode_honours_the_subset_hint_of_a_gateway_filter(tmp_path: Path) -> None:
    # the hint allows only FULL: ICE picks it (where the request fits only downgraded)
    with pool_stack(tmp_path, "ice", subset_of="full") as pool:
        reply = pool.post(BODY)
        assert reply.status == 200, reply
        assert reply.header("x-ice-endpoint") == f"127.0.0.1:{pool.backends['full']}"
        assert reply.header("x-ice-decision") == "downgrade"
        assert len(pool.received("full")) == 1 and pool.received("roomy") == []
