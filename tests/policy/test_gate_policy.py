"""The gate's policy fields: per-request caps, media costs, stored context, route schemas and
passthrough paths, each refused with a message naming the field when it is wrong."""

from __future__ import annotations

import pytest

from ext_proc.admit.pipeline import Pipeline
from ext_proc.policy.load import PolicyError, load_policy, parse_policy


def test_defaults_of_the_gate_fields() -> None:
    p = parse_policy("profiles: {default: {}}")
    prof = p.profiles["default"]
    assert (prof.max_sequences, prof.max_media_parts, prof.max_embedding_inputs) == (16, 16, 2048)
    assert prof.stored_context == "full_window"
    assert prof.media.tokens_per_image == 576
    assert p.passthrough_paths == frozenset()


def test_the_built_in_policy_binds_generate_to_sglang() -> None:
    policy = load_policy(None)
    route = Pipeline(policy, lambda _p: None).router.resolve([("x-ice-route", "generate")])
    assert route.schema is not None and route.schema.name == "sglang.generate"
    other = Pipeline(policy, lambda _p: None).router.resolve([("x-ice-route", "chat")])
    assert other.schema is None  # chosen by path


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("profiles: {a: {max_sequences: 0}}", "profiles.a.max_sequences"),
        ("profiles: {a: {max_media_parts: 0}}", "profiles.a.max_media_parts"),
        ("profiles: {a: {stored_context: keep}}", "profiles.a.stored_context"),
        ("profiles: {a: {media: {tokens_per_image: 0}}}", "profiles.a.media.tokens_per_image"),
        (
            "profiles: {a: {media: {tokens_per_audio_second: 0}}}",
            "profiles.a.media.tokens_per_audio_second",
        ),
        ("profiles: {a: {media: {model_dir: /nonexistent}}}", "profiles.a.media.model_dir"),
        ("routes: {g: {schema: grpc}}", "routes.g.schema"),
        ("passthrough_paths: [tokenize]", "passthrough_paths[0]"),
        ("passthrough_paths: ['/v1/chat/completions']", "passthrough_paths[0]"),
        ("passthrough_paths: ['/tokenize?x=1']", "passthrough_paths[0]"),
    ],
    ids=[
        "max_sequences",
        "max_media_parts",
        "stored_context",
        "tokens_per_image",
        "audio-rate",
        "model_dir",
        "schema",
        "relative-path",
        "judged-path",
        "query",
    ],
)
def test_a_bad_gate_field_names_itself(text: str, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(text)
    assert field in str(e.value)


def test_passthrough_paths_open_exactly_those_paths() -> None:
    policy = parse_policy("passthrough_paths: ['/tokenize']")
    pipeline = Pipeline(policy, lambda _p: None)
    route = pipeline.router.resolve([])

    def headers(path: str) -> list[tuple[str, bytes]]:
        return [(":path", path.encode()), (":method", b"POST")]

    opened = pipeline.on_headers(route, headers("/tokenize?x=1"), end_of_stream=False)
    assert opened.skip_body and opened.answer is None
    closed = pipeline.on_headers(route, headers("/detokenize"), end_of_stream=False)
    assert closed.answer is not None and closed.answer.status == 404
