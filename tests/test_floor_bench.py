"""``bench/grpc_floor.py``'s floors answer what they claim to, so that ``bench/floor_share.py``'s
split of ICE's gap (its answer's content; its judgement; the rest) compares like with like:
the judging floor's body reply is ICE's own reply for the bench request, headers and access-log
metadata alike, and a floor given a reply (``--reply``) sends exactly that one; the plain floor
answers the body with one header and no metadata."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from tests.builders import BENCH, load_bench

sys.path.insert(0, str(BENCH))  # the floor and ``profile_hotpath`` import their siblings
floor = load_bench("grpc_floor.py", "grpc_floor_bench")
hot = load_bench("profile_hotpath.py", "profile_hotpath")


async def _replies(
    servicer: Any, messages: list[pb.ProcessingRequest]
) -> list[pb.ProcessingResponse]:
    async def feed() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    return [r async for r in servicer.Process(feed(), hot.FakeContext())]


def _ice_replies() -> list[pb.ProcessingResponse]:
    servicer, messages = hot.build()
    return asyncio.run(_replies(servicer, messages))


def test_the_judging_floor_answers_the_bench_request_as_ice_does() -> None:
    messages = hot.build()[1]
    judged = asyncio.run(_replies(floor._Judge(), messages))
    ice = _ice_replies()
    assert [r.WhichOneof("response") for r in judged] == ["request_headers", "request_body"]
    sets = judged[1].request_body.response.header_mutation.set_headers
    assert [(h.header.key, h.header.raw_value) for h in sets] == [
        (h.header.key, h.header.raw_value)
        for h in ice[1].request_body.response.header_mutation.set_headers
    ]
    assert ("x-ice-decision", b"pass") in [(h.header.key, h.header.raw_value) for h in sets]
    assert (
        judged[1].dynamic_metadata.fields["ice"].struct_value.fields["x-ice-decision"].string_value
        == "pass"
    )


def test_a_floor_given_a_reply_sends_that_reply_and_the_plain_floor_one_header() -> None:
    messages = hot.build()[1]
    plain = asyncio.run(_replies(floor._Aio(), messages))
    sets = plain[1].request_body.response.header_mutation.set_headers
    assert [(h.header.key, h.header.raw_value) for h in sets] == [("x-mem-pressure", b"low")]
    assert not plain[1].HasField("dynamic_metadata")
    ice = _ice_replies()[1]
    floor._REPLY.append(ice)
    try:
        given = asyncio.run(_replies(floor._Aio(), messages))
    finally:
        floor._REPLY.clear()
    assert given[1].SerializeToString() == ice.SerializeToString()
    assert given[0] == floor.HEADERS_REPLY
