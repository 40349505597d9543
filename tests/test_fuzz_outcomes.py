"""``bench/fuzz.py``'s verdict on what reached the backend: a rewrite of the output limit is
a mutation wherever the API keeps it (top level, or inside ``sampling_params``); any other
change is an alteration (the 100k run flagged ICE's correct downgrade of
``sampling_params.max_tokens`` on ``/inference/v1/generate`` as one)."""

from __future__ import annotations

import json

from tests.builders import load_bench

fuzz = load_bench("fuzz.py", "fuzz_bench")


def body(**doc: object) -> bytes:
    return json.dumps({"model": "m", "token_ids": [1, 2], **doc}).encode()


def test_a_limit_rewritten_inside_sampling_params_is_a_mutation() -> None:
    sent = body(sampling_params={"max_tokens": 10**30, "temperature": 0})
    got = body(sampling_params={"max_tokens": 7677, "temperature": 0})
    assert fuzz.only_limits_differ(sent, got)
    batch = body(sampling_params=[{"max_new_tokens": 10**6}, {"max_new_tokens": 5}])
    cut = body(sampling_params=[{"max_new_tokens": 100}, {"max_new_tokens": 5}])
    assert fuzz.only_limits_differ(batch, cut)


def test_any_other_change_is_an_alteration() -> None:
    sent = body(sampling_params={"max_tokens": 10, "temperature": 0})
    assert not fuzz.only_limits_differ(sent, body(sampling_params={"max_tokens": 10}))
    assert not fuzz.only_limits_differ(
        sent, body(sampling_params={"max_tokens": 10, "temperature": 1})
    )
    assert not fuzz.only_limits_differ(body(max_tokens=5), body(max_tokens=5, n=2))
    assert fuzz.only_limits_differ(body(max_tokens=50), body(max_tokens=5))
