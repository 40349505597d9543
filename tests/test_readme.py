"""The README's sample policy is a policy ICE loads, with the fields it shows."""

from __future__ import annotations

import re
from pathlib import Path

from ext_proc.policy.load import parse_policy

README = Path(__file__).resolve().parent.parent / "README.md"


def _sample_policy() -> str:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "the README shows one sample policy"
    return blocks[0]


def test_readme_sample_policy_loads_with_the_fields_it_shows() -> None:
    policy = parse_policy(_sample_policy(), source="README.md")
    profile = policy.profiles["default"]
    assert profile.admission == "forecast"
    assert profile.max_model_len == 8192
    assert "chat" in policy.routes


def test_readme_opens_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    fence = lines.index("```sh")
    assert lines[fence + 1].startswith("make demo ")
    assert lines[fence + 2].startswith("make test ")
    assert len(lines) < 120
