"""The figures the deploy docs state about the generated Envoy settings are the generator's:
each is read from ``ext_proc/tools/envoygen/pieces.py`` (and, where the generated files carry
it, from them), then looked for in the docs.

What is checked (each by a pattern tied to the setting's name, so a figure about something
else, such as Envoy's own defaults, is not mistaken for it):

- every duration written right after ``max_message_timeout`` (in the same sentence or table
  cell: ``max_message_timeout: 60s``, ``grep max_message_timeout  # "60s"``, ``…must be at
  least that (60 s …``) is ``pieces.MAX_MESSAGE_TIMEOUT``, in every doc;
- every ``N streams`` in the deploy docs and docs/envoy.md is
  ``pieces.ICE_STREAMS_PER_CONNECTION``;
- every body limit written as a setting (``per_connection_buffer_limit_bytes: N``,
  ``request_body_buffer_limit: N``, ``bufferLimit: 8Mi``) is ``pieces.MAX_BODY_BYTES``;
- the count of judged routes a ``grep -c '"x-ice-route"'`` is said to give is the number of
  routes in ``envoy/mesh.yaml``;
- docs/configuration.md's access log table names the generated log's fields, no more, no less.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DEPLOY_DOCS = [*sorted(DOCS.glob("deploy-*.md")), DOCS / "envoy.md"]
SETTING_DOCS = [*DEPLOY_DOCS, DOCS / "configuration.md", DOCS / "doctor.md"]
GENERATED = {
    "local": REPO / "envoy" / "envoy.yaml",
    "envoy-gateway": REPO / "envoy" / "k8s" / "overlays" / "envoy-gateway" / "generated",
}
# A duration after the setting's name, before the sentence, clause or table cell ends.
AFTER_MAX_MESSAGE_TIMEOUT = re.compile(
    r"max_message_timeout[^|.;]*?(\d+(?:\.\d+)?) ?(ms|s)\b", re.DOTALL
)
STREAMS = re.compile(r"(\d[\d,]*) streams\b")
BODY_LIMIT = re.compile(
    r"(?:per_connection_buffer_limit_bytes|request_body_buffer_limit|bufferLimit):?\s*`?(\d+)(Mi)?\b"
)
ROUTE_GREP = re.compile(r"""grep -c '"x-ice-route"'\s+# (\d+)""")


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000 if unit == "ms" else 1)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _generated_max_message_timeouts_s() -> set[float]:
    """``max_message_timeout`` as the generated files write it (the local bootstrap's
    ext_proc filter, Envoy Gateway's patch value)."""
    found = set()
    local = GENERATED["local"].read_text()
    found |= {float(m) for m in re.findall(r"max_message_timeout: (\d+(?:\.\d+)?)s", local)}
    for path in GENERATED["envoy-gateway"].glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "EnvoyPatchPolicy":
                continue
            for patch in doc["spec"]["jsonPatches"]:
                op = patch["operation"]
                if op.get("path", "").endswith("/max_message_timeout"):
                    found.add(float(str(op["value"]).removesuffix("s")))
    return found


def test_the_generated_files_carry_the_generators_max_message_timeout() -> None:
    assert _generated_max_message_timeouts_s() == {pieces.MAX_MESSAGE_TIMEOUT.total_seconds()}


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_max_message_timeout_a_doc_states_is_the_generators(doc: Path) -> None:
    want_s = pieces.MAX_MESSAGE_TIMEOUT.total_seconds()
    text = doc.read_text()
    wrong = [
        f"{doc.name}:{_line(text, m.start())}: {m.group(1)} {m.group(2)}"
        for m in AFTER_MAX_MESSAGE_TIMEOUT.finditer(text)
        if _seconds(m.group(1), m.group(2)) != want_s
    ]
    assert wrong == [], f"the generator sets max_message_timeout {want_s:g} s"


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda p: p.name)
def test_every_stream_limit_a_deploy_doc_states_is_the_generators(doc: Path) -> None:
    text = doc.read_text()
    stated = {int(m.group(1).replace(",", "")) for m in STREAMS.finditer(text)}
    assert stated <= {pieces.ICE_STREAMS_PER_CONNECTION}


@pytest.mark.parametrize("doc", SETTING_DOCS, ids=lambda p: p.name)
def test_every_body_limit_setting_a_doc_states_is_the_generators(doc: Path) -> None:
    text = doc.read_text()
    stated = {
        int(m.group(1)) * (1024 * 1024 if m.group(2) else 1) for m in BODY_LIMIT.finditer(text)
    }
    assert stated <= {pieces.MAX_BODY_BYTES}


def test_the_route_count_the_envoy_gateway_doc_greps_for_is_the_specs() -> None:
    text = (DOCS / "deploy-envoy-gateway.md").read_text()
    routes = len(load_spec(REPO / "envoy" / "mesh.yaml").routes)
    assert [int(n) for n in ROUTE_GREP.findall(text)] == [routes]


def test_the_patterns_find_what_they_look_for() -> None:
    """Each pattern matches the forms the docs use (else the tests above pass on nothing)."""
    found = [
        (m.group(1), m.group(2))
        for m in AFTER_MAX_MESSAGE_TIMEOUT.finditer(
            '`max_message_timeout: 10s` | x\ngrep max_message_timeout   # "60s"\n'
            "Envoy's `max_message_timeout` must be at least that\n  (60 s in the generated\n"
            "| `envoy.max_message_timeout` | ext_proc `max_message_timeout` | 1 s |"
        )
    ]
    assert found == [("10", "s"), ("60", "s"), ("60", "s")]
    assert STREAMS.findall("up to 1,024 streams per") == ["1,024"]
    assert BODY_LIMIT.findall("`bufferLimit: 8Mi`, `per_connection_buffer_limit_bytes:\n") == [
        ("8", "Mi")
    ]
    assert BODY_LIMIT.findall(
        "(`LISTENER` `MERGE`, `per_connection_buffer_limit_bytes: 8388608`"
    ) == [("8388608", "")]


def test_the_access_log_table_lists_the_generated_fields() -> None:
    """docs/configuration.md's "Envoy's access log" table names exactly the fields the
    generated access log writes (``hcm_settings.ACCESS_LOG_FIELDS``)."""
    from ext_proc.tools.envoygen.hcm_settings import ACCESS_LOG_FIELDS

    text = (DOCS / "configuration.md").read_text()
    section = text.split("## Envoy's access log", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert documented == {name for name, _ in ACCESS_LOG_FIELDS}
