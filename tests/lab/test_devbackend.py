"""Tests for ext_proc.lab.devbackend, the fake OpenAI/Anthropic/vLLM upstream."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import openai
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from ext_proc.lab.devbackend import BACKEND, build_app

MODEL = "dev-test-model"
Client = TestClient[Any, Any]


def run(test: Callable[[Client], Awaitable[None]]) -> None:
    """Run ``test`` against a fresh in-process devbackend."""

    async def main() -> None:
        async with TestClient(TestServer(build_app(MODEL))) as client:
            await test(client)

    asyncio.run(main())


def root(client: Client) -> str:
    return str(client.make_url("")).rstrip("/")


async def metric_families(client: Client) -> dict[str, Any]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {f.name: f for f in text_string_to_metric_families(await resp.text())}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    for sample in families[name].samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()) and not sample.name.endswith(
            "_created"
        ):
            return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_openai_sdk_chat_and_completions() -> None:
    async def body(client: Client) -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{root(client)}/v1", api_key="x", max_retries=0
        ) as oa:
            msgs: Any = [{"role": "user", "content": "hello there friend"}]
            reply = await oa.chat.completions.create(model="m1", messages=msgs, max_tokens=3)
            assert reply.object == "chat.completion"
            assert reply.id.startswith("chatcmpl-")
            assert reply.model == "m1"
            assert reply.choices[0].message.content == "tok0 tok1 tok2"
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage is not None
            assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
            assert reply.usage.total_tokens == 10

            long = await oa.chat.completions.create(
                model="m1", messages=msgs, max_completion_tokens=100
            )
            assert long.choices[0].finish_reason == "stop"
            assert long.choices[0].message.content == " ".join(f"tok{i}" for i in range(16))

            stream = await oa.chat.completions.create(
                model="m1",
                messages=msgs,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "tok0 tok1 tok2 tok3"
            assert chunks[0].choices[0].delta.role == "assistant"
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
            assert chunks[-1].choices == []
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 4

            comp = await oa.completions.create(model="m2", prompt=["a b", "c"], max_tokens=2)
            assert comp.object == "text_completion"
            assert comp.choices[0].text == "tok0 tok1"
            assert comp.choices[0].finish_reason == "length"
            assert comp.usage is not None
            assert comp.usage.prompt_tokens == 3

            cstream = await oa.completions.create(model="m2", prompt="x", stream=True)
            ctext = "".join([c.choices[0].text async for c in cstream])
            assert ctext == " ".join(f"tok{i}" for i in range(16))

    run(body)


def test_anthropic_sdk_messages() -> None:
    async def body(client: Client) -> None:
        async with anthropic.AsyncAnthropic(
            base_url=root(client), api_key="x", max_retries=0
        ) as an:
            msgs: Any = [
                {"role": "user", "content": "one two"},
                {"role": "assistant", "content": [{"type": "text", "text": "three"}]},
                {"role": "user", "content": "four"},
            ]
            reply = await an.messages.create(
                model="claude-x", system="be brief", messages=msgs, max_tokens=5
            )
            assert reply.id.startswith("msg_")
            assert reply.model == "claude-x"
            assert reply.content[0].type == "text"
            assert reply.content[0].text == "tok0 tok1 tok2 tok3 tok4"
            assert reply.stop_reason == "max_tokens"
            assert reply.stop_sequence is None
            assert (reply.usage.input_tokens, reply.usage.output_tokens) == (18, 5)

            async with an.messages.stream(model="claude-x", messages=msgs, max_tokens=64) as stream:
                deltas = [t async for t in stream.text_stream]
                final = await stream.get_final_message()
            assert "".join(deltas) == " ".join(f"tok{i}" for i in range(16))
            assert len(deltas) == 16
            assert final.stop_reason == "end_turn"
            assert final.usage.output_tokens == 16

    run(body)


def test_metrics_reflect_state_and_counters() -> None:
    async def body(client: Client) -> None:
        fams = await metric_families(client)
        assert value(fams, "vllm:kv_cache_usage_perc", model_name=MODEL, engine="0") == 0.0
        assert "vllm:gpu_cache_usage_perc" not in fams
        info = fams["vllm:cache_config_info"].samples[0]
        assert info.labels["num_gpu_blocks"] == "65536"
        assert info.labels["kv_cache_size_tokens"] == str(65536 * 16)

        update = {
            "kv_cache_usage_perc": 0.75,
            "num_requests_running": 7,
            "num_requests_waiting": 3,
            "num_gpu_blocks": 100,
            "block_size": 32,
            "num_preemptions_total": 5,
        }
        resp = await client.put("/_dev/state", json=update)
        assert resp.status == 200
        state = await resp.json()
        assert state == {**state, **update}
        assert state["legacy"] is False
        assert await (await client.get("/_dev/state")).json() == state

        await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})
        fams = await metric_families(client)
        assert value(fams, "vllm:kv_cache_usage_perc") == 0.75
        assert value(fams, "vllm:num_requests_running") == 7
        assert value(fams, "vllm:num_requests_waiting") == 3
        assert value(fams, "vllm:num_preemptions") == 5
        info = fams["vllm:cache_config_info"].samples[0]
        assert info.value == 1
        assert info.labels["block_size"] == "32"
        assert info.labels["kv_cache_size_tokens"] == "3200"
        assert info.labels["enable_prefix_caching"] == "True"
        assert value(fams, "vllm:generation_tokens") == 2
        assert value(fams, "vllm:request_success", finished_reason="length") == 1
        assert "vllm:num_preemptions_total{" in await (await client.get("/metrics")).text()

        for bad in ({"legacy": 1}, {"num_gpu_blocks": 1.5}, {"nope": 1}, [1]):
            assert (await client.put("/_dev/state", json=bad)).status == 400

    run(body)


def test_legacy_flag_switches_gauge_name() -> None:
    async def body(client: Client) -> None:
        await client.put("/_dev/state", json={"legacy": True, "kv_cache_usage_perc": 0.5})
        fams = await metric_families(client)
        assert value(fams, "vllm:gpu_cache_usage_perc") == 0.5
        assert "vllm:kv_cache_usage_perc" not in fams

    run(body)


def test_raw_metrics_served_verbatim_and_metrics_delay() -> None:
    async def body(client: Client) -> None:
        garbage = b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_na"
        assert (await client.put("/_dev/metrics", data=garbage)).status == 200
        assert await (await client.get("/metrics")).read() == garbage
        assert (await client.delete("/_dev/metrics")).status == 200
        assert "vllm:kv_cache_usage_perc" in await metric_families(client)

        await client.put("/_dev/state", json={"metrics_delay_s": 0.2})
        start = time.monotonic()
        await client.get("/metrics")
        assert time.monotonic() - start >= 0.19

    run(body)


def test_recording_keeps_raw_bytes() -> None:
    async def body(client: Client) -> None:
        raw = '{ "messages" : [{"role":"user","content":"h\u00e9llo \\u00e9"}] ,"max_tokens":1}'
        raw_bytes = raw.encode()
        await client.post(
            "/v1/chat/completions?x=1",
            data=raw_bytes,
            headers={"X-B": "2", "X-A": "1", "Content-Type": "application/json"},
        )
        await client.post("/v1/messages", data=b"\xff\x00not json")
        recorded = await (await client.get("/_dev/requests")).json()
        assert len(recorded) == 2
        first = recorded[0]
        assert (first["method"], first["path"], first["query"]) == (
            "POST",
            "/v1/chat/completions",
            "x=1",
        )
        assert base64.b64decode(first["body_b64"]) == raw_bytes
        names = [name for name, _ in first["headers"]]
        assert names.index("X-B") < names.index("X-A")
        assert ["X-A", "1"] in first["headers"]
        assert abs(first["time"] - time.time()) < 10
        assert base64.b64decode(recorded[1]["body_b64"]) == b"\xff\x00not json"
        await client.get("/metrics")  # not an inference endpoint: not recorded
        assert len(await (await client.get("/_dev/requests")).json()) == 2
        assert (await client.delete("/_dev/requests")).status == 200
        assert await (await client.get("/_dev/requests")).json() == []
        assert client.app is not None
        assert client.app[BACKEND].requests.maxlen == 1000

    run(body)


def test_invalid_requests_get_400_in_endpoint_format() -> None:
    async def body(client: Client) -> None:
        for path in ("/v1/chat/completions", "/v1/completions"):
            resp = await client.post(path, data=b"{not json")
            assert resp.status == 400
            err = (await resp.json())["error"]
            assert err["type"] == "invalid_request_error"
            assert err["param"] is None
            assert err["code"] is None
            assert err["message"]

        resp = await client.post("/v1/messages", data=b"{not json")
        assert resp.status == 400
        reply = await resp.json()
        assert reply["type"] == "error"
        assert reply["error"]["type"] == "invalid_request_error"

        missing = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        resp = await client.post("/v1/messages", json=missing)
        assert resp.status == 400
        assert "max_tokens" in (await resp.json())["error"]["message"]

    run(body)


def test_stream_delay_header_and_misc_endpoints() -> None:
    async def body(client: Client) -> None:
        start = time.monotonic()
        resp = await client.post(
            "/v1/chat/completions",
            json={"messages": [], "max_tokens": 2, "stream": True},
            headers={"x-dev-stream-delay-ms": "30"},
        )
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = await resp.text()
        # role chunk, 2 word chunks, finish chunk, [DONE]: 4 gaps of 30 ms
        assert time.monotonic() - start >= 0.11
        events = [e for e in text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[0][len("data: ") :])["object"] == "chat.completion.chunk"

        # A client that goes away mid-stream is counted as an abort (TestServer cancels).
        resp = await client.post(
            "/v1/completions",
            json={"prompt": "p", "stream": True},
            headers={"x-dev-stream-delay-ms": "20"},
        )
        await resp.content.readline()
        resp.close()
        for _ in range(50):
            fams = await metric_families(client)
            if value(fams, "vllm:request_success", finished_reason="abort") == 1:
                break
            await asyncio.sleep(0.01)
        assert value(fams, "vllm:request_success", finished_reason="abort") == 1
        assert value(fams, "vllm:request_success", finished_reason="length") == 1

        health = await client.get("/health")
        assert health.status == 200
        assert await health.read() == b""
        listing = await (await client.get("/v1/models")).json()
        assert listing["object"] == "list"
        assert [m["id"] for m in listing["data"]] == [MODEL]

    run(body)


def test_main_subprocess_prints_listening_line_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ext_proc.lab.devbackend", "--port", "0", "--model", "sub-model"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("devbackend listening on http://127.0.0.1:")
        url = line.split(" ")[-1]

        async def check() -> None:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{url}/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "sub-model"
                # A client that goes away mid-stream is counted as an abort.
                req = {"messages": [], "max_tokens": 8, "stream": True}
                delay = {"x-dev-stream-delay-ms": "20"}
                async with session.post(f"{url}/v1/messages", json=req, headers=delay) as r:
                    await r.content.readline()
                    r.close()
                for _ in range(50):
                    async with session.get(f"{url}/metrics") as r:
                        fams = {f.name: f for f in text_string_to_metric_families(await r.text())}
                    if value(fams, "vllm:request_success", finished_reason="abort") == 1:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError("abort not counted")

        asyncio.run(check())
        proc.terminate()
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_openai_sdk_responses_and_embeddings() -> None:
    async def body(client: Client) -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{root(client)}/v1", api_key="x", max_retries=0
        ) as oa:
            items: Any = [{"role": "user", "content": [{"type": "input_text", "text": "a b c"}]}]
            reply = await oa.responses.create(
                model="r1", input=items, instructions="be brief", max_output_tokens=3
            )
            assert reply.id.startswith("resp_")
            assert (reply.object, reply.status, reply.model) == ("response", "completed", "r1")
            assert reply.output_text == "tok0 tok1 tok2"
            assert reply.usage is not None
            assert (reply.usage.input_tokens, reply.usage.output_tokens) == (9, 3)
            plain = await oa.responses.create(model="r1", input="one two", max_output_tokens=100)
            assert plain.output_text == " ".join(f"tok{i}" for i in range(16))

            stream = await oa.responses.create(
                model="r1", input="hi", max_output_tokens=2, stream=True
            )
            events = [e async for e in stream]
            assert events[0].type == "response.created"
            assert events[-1].type == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
            assert "".join(deltas) == "tok0 tok1"
            final: Any = events[-1]
            assert final.response.output_text == "tok0 tok1"

            emb = await oa.embeddings.create(model="e1", input=["a b", "c", "d e f"])
            assert [d.index for d in emb.data] == [0, 1, 2]
            assert [d.embedding[0] for d in emb.data] == [2.0, 1.0, 3.0]
            assert len(emb.data[0].embedding) == 8
            assert emb.usage.prompt_tokens == 6
            floats = await oa.embeddings.create(
                model="e1", input=[[1, 2, 3], [4]], encoding_format="float"
            )
            assert [d.embedding[0] for d in floats.data] == [3.0, 1.0]
            one = await oa.embeddings.create(model="e1", input=[5, 6, 7, 8])
            assert len(one.data) == 1
            assert one.data[0].embedding[0] == 4.0

    run(body)


async def post_json(client: Client, path: str, doc: Any) -> tuple[int, Any]:
    resp = await client.post(path, json=doc)
    return resp.status, await resp.json()


def test_vllm_and_sglang_endpoints() -> None:
    async def body(client: Client) -> None:
        convs = [[{"role": "user", "content": "one two"}], [{"role": "user", "content": "x"}]]
        status, batch = await post_json(
            client, "/v1/chat/completions/batch", {"messages": convs, "max_tokens": 2}
        )
        assert status == 200
        assert batch["object"] == "chat.completion"
        assert [c["index"] for c in batch["choices"]] == [0, 1]
        assert {c["message"]["content"] for c in batch["choices"]} == {"tok0 tok1"}
        assert batch["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
        for bad in ({"messages": [{"role": "user"}]}, {"messages": convs, "n": 2}):
            assert (await client.post("/v1/chat/completions/batch", json=bad)).status == 400

        msgs = [{"role": "user", "content": "hi"}]
        status, chat = await post_json(client, "/invocations", {"messages": msgs, "max_tokens": 1})
        assert (status, chat["object"]) == (200, "chat.completion")
        assert chat["choices"][0]["message"]["content"] == "tok0"
        status, comp = await post_json(client, "/invocations", {"prompt": "p q", "max_tokens": 2})
        assert (status, comp["object"]) == (200, "text_completion")
        assert comp["choices"][0]["text"] == "tok0 tok1"

        gen = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 3}}
        status, tokens = await post_json(client, "/inference/v1/generate", gen)
        assert status == 200
        assert tokens["choices"][0]["token_ids"] == [0, 1, 2]
        assert tokens["choices"][0]["finish_reason"] == "length"
        assert tokens["usage"]["prompt_tokens"] == 3
        assert (await client.post("/inference/v1/generate", json={"prompt": "x"})).status == 400

        sg = {"text": "a b c d", "sampling_params": {"max_new_tokens": 2}}
        status, sglang = await post_json(client, "/generate", sg)
        assert status == 200
        assert sglang["text"] == "tok0 tok1"
        assert sglang["meta_info"]["prompt_tokens"] == 4
        assert sglang["meta_info"]["completion_tokens"] == 2
        assert sglang["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
        resp = await client.post("/generate", json={**sg, "stream": True})
        events = [e for e in (await resp.text()).split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: ") :])["text"] == "tok0 tok1"

        recorded = await (await client.get("/_dev/requests")).json()
        paths = [r["path"] for r in recorded]
        assert paths.count("/v1/chat/completions/batch") == 3  # rejected bodies too
        assert {"/invocations", "/inference/v1/generate", "/generate"} <= set(paths)

    run(body)


def test_any_other_request_is_recorded_and_answered_200() -> None:
    async def body(client: Client) -> None:
        for method, path in [
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/collective_rpc"),
            ("GET", "/some/thing"),
            ("POST", "/v1/models"),  # another method on a control path
            ("DELETE", "/v1/chat/completions"),
            ("HEAD", "/version"),
        ]:
            resp = await client.request(method, path, data=b'{"x": 1}')
            assert resp.status == 200, (method, path)
            if method != "HEAD":
                assert await resp.json() == {
                    "object": "devbackend.unrouted",
                    "method": method,
                    "path": path,
                }
        recorded = await (await client.get("/_dev/requests")).json()
        assert [(r["method"], r["path"]) for r in recorded][:2] == [
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/collective_rpc"),
        ]
        assert len(recorded) == 6
        assert base64.b64decode(recorded[0]["body_b64"]) == b'{"x": 1}'

        # The control endpoints still win, and are never recorded.
        await client.delete("/_dev/requests")
        for method, path in [
            ("GET", "/health"),
            ("HEAD", "/health"),
            ("GET", "/v1/models"),
            ("HEAD", "/v1/models"),
            ("GET", "/metrics"),
            ("GET", "/_dev/state"),
            ("GET", "/_dev/requests"),
        ]:
            assert (await client.request(method, path)).status == 200, (method, path)
        assert (await client.post("/_dev/nope")).status == 404
        assert (await client.post("/_dev/state")).status == 404  # not a recorded 200
        assert await (await client.get("/_dev/requests")).json() == []

    run(body)


INFERENCE_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/chat/completions/batch",
    "/invocations",
    "/inference/v1/generate",
    "/generate",
)
BAD_BODIES = (
    b"[" * 20_000 + b"]" * 20_000,  # nested past the parser's recursion limit
    b'{"messages": [' * 5_000 + b"]}" * 5_000,
    b"\xff\xfe{}",  # not UTF-8
    b"\xef\xbb\xbf" + b"{",  # a BOM, then cut-off JSON
    b"[1, 2, 3]",  # not an object
    b'"text"',
)
# Bodies it can read but whose fields make no sense: answered (200 or 400), never a 500.
ODD_BODIES = (
    b'{"model": "m", "messages": 5, "prompt": {}, "input": 7, "max_tokens": "lots"}',
    b'{"model": "m", "messages": [1, "two", null], "max_tokens": 8}',
    b'{"model": "m", "messages": [{"role": "user", "content": {"nested": 1}}], "max_tokens": -3}',
    b'{"model": "m", "prompt": [[1, "a"]], "max_tokens": 1e30, "n": "x"}',
    b'{"text": 5, "sampling_params": [1], "token_ids": {"a": 1}}',
    b'{"model": "m", "input": [{"type": 3}], "max_output_tokens": []}',
)


def test_a_body_the_backend_cannot_read_is_a_400_on_every_endpoint_never_a_500() -> None:
    async def body(client: Client) -> None:
        for path in INFERENCE_PATHS:
            for data in BAD_BODIES + ODD_BODIES:
                for ctype in ("application/json", "text/plain"):
                    resp = await client.post(path, data=data, headers={"content-type": ctype})
                    reply = await resp.json()
                    if data in BAD_BODIES:
                        assert resp.status == 400, (path, data[:40], ctype, resp.status)
                        assert "error" in reply, (path, data[:40], reply)
                    else:
                        assert resp.status in (200, 400), (path, data[:40], ctype, resp.status)

    run(body)


def test_the_valve_answers_like_vllms_admission_valve() -> None:
    """Shut, the valve refuses every request vLLM 0.32 gates with vLLM's own 503 (Starlette's
    compact JSON, ``server: uvicorn``, no Retry-After), records it and counts it in
    ``vllm:admission_rejections_total``; embeddings and SGLang's /generate are not gated."""

    async def body(client: Client) -> None:
        assert (await client.put("/_dev/state", json={"valve": "wide"})).status == 400
        assert (
            await client.put("/_dev/state", json={"valve": "max_num_queued_reqs"})
        ).status == 200
        chat = await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})
        assert chat.status == 503
        assert chat.headers["Content-Type"] == "application/json"
        assert chat.headers["Server"] == "uvicorn" and "Retry-After" not in chat.headers
        assert await chat.read() == (
            b'{"error":{"message":"The engine is currently busy and cannot accept new requests.'
            b' Please try again later or on a different instance.","type":"Service Unavailable"'
            b',"param":null,"code":503}}'
        )
        await client.put("/_dev/state", json={"valve": "max_num_queued_tokens"})
        msg = await client.post("/v1/messages", json={"messages": [], "max_tokens": 2})
        assert msg.status == 503
        assert await msg.json() == {
            "type": "error",
            "error": {
                "type": "Service Unavailable",
                "message": "The engine has reached its prefill token backlog limit. "
                "Please try again later or on a different instance.",
            },
        }
        for path in ("/v1/completions", "/v1/responses", "/invocations"):
            assert (await client.post(path, json={"prompt": "x"})).status == 503, path
        assert (await client.post("/v1/embeddings", json={"input": "x"})).status == 200
        assert (await client.post("/generate", json={"text": "x"})).status == 200
        recorded = await (await client.get("/_dev/requests")).json()
        assert [r["path"] for r in recorded][:2] == ["/v1/chat/completions", "/v1/messages"]
        fams = await metric_families(client)
        assert value(fams, "vllm:admission_rejections", reason="max_num_queued_reqs") == 1
        assert value(fams, "vllm:admission_rejections", reason="max_num_queued_tokens") == 4
        assert (await client.put("/_dev/state", json={"valve": ""})).status == 200
        ok = await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})
        assert ok.status == 200

    run(body)
