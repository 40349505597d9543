"""The demo's prefix report: a route whose system prompt starts with the time is named, with
the place and the kind of the value that breaks its prefix cache."""

from __future__ import annotations

from ext_proc.lab.demo.common import prefix_report_demo


def test_the_demo_names_the_timestamp_that_breaks_the_prefix() -> None:
    text = prefix_report_demo()
    assert "system prompt, character 14: a value like <timestamp>" in text
    assert "changes on every request (40 of 40 requests)" in text
    assert "2026-12-02" not in text  # the value itself is redacted
