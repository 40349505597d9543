"""Checks of what an inference HCM does to a request before ICE sees it: the spoofed
verdict headers stripped, the path normalised, the body limit.

Job: ``strip_check`` (a ``header_mutation`` filter ahead of ext_proc, or the HCM's
``early_header_mutation_extensions`` as Envoy Gateway builds it, must remove every header
prefix and name in ``pieces.SPOOF_PREFIXES`` / ``SPOOF_NAMES``), ``normalise_check``
(``normalize_path``, ``merge_slashes``, unescaped ``%2F``) and ``buffer_check`` (the
listener's ``per_connection_buffer_limit_bytes`` at least ICE's ``--max-body-bytes``).

Invariants: pure; a removal counts when its matcher is a prefix of the header (``prefix``),
the header itself (``exact`` / ``remove``, names only) or a regex matching it.
"""

from __future__ import annotations

import re
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.dump import HcmView, as_dict, as_list, unwrap
from ext_proc.tools.doctor.model import Check, fail

__all__ = ["buffer_check", "normalise_check", "strip_check"]

HEADER_MUTATION_TYPE = "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
GOOD_ESCAPED_SLASHES = ("UNESCAPE_AND_FORWARD", "UNESCAPE_AND_REDIRECT", "REJECT_REQUEST")


def _mutation_removals(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        m = as_dict(item)
        if "remove" in m:
            out.append({"exact": str(m["remove"])})
        elif "remove_on_match" in m:
            out.append(as_dict(as_dict(m["remove_on_match"]).get("key_matcher")))
    return out


def _covers(matcher: dict[str, Any], header: str, prefix: bool) -> bool:
    """Whether a removal matcher removes ``header`` (every header starting with it when
    ``prefix``)."""
    h = header.lower()
    if "prefix" in matcher:
        return h.startswith(str(matcher["prefix"]).lower())
    if "exact" in matcher:
        return not prefix and h == str(matcher["exact"]).lower()
    if "safe_regex" in matcher:
        regex = str(as_dict(matcher["safe_regex"]).get("regex", ""))
        probe = h + "doctor-probe" if prefix else h
        return re.fullmatch(regex, probe) is not None
    return False


def strip_check(hcm: HcmView, first_ext_proc: int, where: str) -> Check:
    removals: list[dict[str, Any]] = []
    used: list[str] = []
    ignored: list[str] = []
    for ext in as_list(hcm.hcm.get("early_header_mutation_extensions")):
        _, config = unwrap(as_dict(ext).get("typed_config"))
        removals += _mutation_removals(as_list(config.get("mutations")))
        used.append("early_header_mutation_extensions")
    for i, f in enumerate(hcm.filters):
        if f.type != HEADER_MUTATION_TYPE and not (not f.type and f.name == X.HEADER_MUTATION):
            continue
        if i > first_ext_proc or f.disabled:
            ignored.append(f"{f.name} {'disabled' if f.disabled else 'after ext_proc'}")
            continue
        requests = as_dict(f.config.get("mutations")).get("request_mutations")
        removals += _mutation_removals(as_list(requests))
        used.append(f"filter {f.name}")
    wanted = [(p, True) for p in X.SPOOF_PREFIXES] + [(n, False) for n in X.SPOOF_NAMES]
    missing = [
        f"{h}*" if prefix else h
        for h, prefix in wanted
        if not any(_covers(m, h, prefix) for m in removals)
    ]
    if missing:
        seen = ", ".join(used) or "no header_mutation filter before ext_proc"
        if ignored:
            seen += f"; {', '.join(ignored)} does not count"
        return fail(
            "envoy.strip_spoofed_headers",
            f"{where}: a client's {', '.join(missing)} reach ICE and the backend ({seen})",
            "put pieces.strip_spoofed_headers() (header_mutation removing "
            f"{', '.join(f'{p}*' for p in X.SPOOF_PREFIXES)}, {', '.join(X.SPOOF_NAMES)}) "
            "before ext_proc",
        )
    return Check("PASS", "envoy.strip_spoofed_headers", f"{where}: removed by {', '.join(used)}")


def buffer_check(hcm: HcmView, where: str) -> Check:
    limit, want = hcm.buffer_limit_bytes, X.MAX_BODY_BYTES
    said = "" if hcm.buffer_limit_set else " (not set: Envoy's default)"
    if limit < want:
        return fail(
            "envoy.buffer_limit",
            f"{where}: per_connection_buffer_limit_bytes {limit}{said} < ICE's --max-body-bytes "
            f"{want}: larger bodies get Envoy's 413 before ICE sees them",
            f"per_connection_buffer_limit_bytes: {want} on the listener",
        )
    return Check("PASS", "envoy.buffer_limit", f"{where}: {limit} bytes ≥ {want}")


def normalise_check(hcm: HcmView, where: str) -> Check:
    h = hcm.hcm
    problems = []
    if h.get("normalize_path") is not True:
        problems.append("normalize_path off")
    if h.get("merge_slashes") is not True:
        problems.append("merge_slashes off")
    action = str(h.get("path_with_escaped_slashes_action", "KEEP_UNCHANGED"))
    if action not in GOOD_ESCAPED_SLASHES:
        problems.append(f"path_with_escaped_slashes_action {action}")
    if problems:
        return fail(
            "envoy.path_normalisation",
            f"{where}: {', '.join(problems)}: /v1/chat/%63ompletions, //v1/chat/completions or "
            "/v1/chat%2Fcompletions are routed as written, not as the backend reads them",
            "normalize_path: true, merge_slashes: true, path_with_escaped_slashes_action: "
            "UNESCAPE_AND_FORWARD",
        )
    return Check(
        "PASS", "envoy.path_normalisation", f"{where}: normalize_path, merge_slashes, {action}"
    )
