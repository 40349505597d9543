"""The prefix report: per route, the stability score and the places that break reuse.

Job: over recorded requests ``(route, body)`` in arrival order, render each (``render``),
make its tokens (pseudo-tokens, or a tokenizer's ids), feed a ``PrefixTracker`` (the route's
score), group each route's prompts by template fingerprint and compare every prompt with the
one before it in its group (``diverge.sites``). Sites are gathered per route by section,
kind and offset (sites of one section and kind within ``MERGE_CHARS`` (16) characters are one
finding, shown at its most frequent offset) and reported earliest first.

Per finding: ``requests`` = requests that differ there from the previous or the next
request of their group, out of ``group_requests`` (the requests of the groups it was seen
in); ``shared_blocks`` / ``total_blocks`` = medians over its pairs of the leading blocks the
later prompt shares with the earlier one (``blocks.shared_leading_blocks``, vLLM's hit cap)
and its full blocks; for a site that is not a pair's first difference the shared count is an
estimate (``estimated``): the full blocks before its offset had the earlier sites been
fixed, ``floor(P × offset / len(text) / B)``. Sites in the last message (the request's own
question, which no earlier prompt could hold) are expected and left out.

Invariants: output holds no prompt text except ``diverge.context``'s redacted excerpts; the
work is O(total characters + total blocks); memory holds one route's rendered prompts at a
time plus the tracker (``tracker`` module bound).
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ext_proc.prefix.blocks import (
    DEFAULT_BLOCK_SIZE,
    block_hashes,
    hit_blocks,
    pseudo_tokens,
    shared_leading_blocks,
)
from ext_proc.prefix.diverge import context, fingerprint, sites
from ext_proc.prefix.render import Rendered, render_body
from ext_proc.prefix.tracker import PrefixTracker

__all__ = ["Finding", "RouteReport", "build_report", "format_text"]

MERGE_CHARS = 16
TokenFn = Callable[[Any, Rendered], list[int]]


@dataclass(frozen=True, slots=True)
class Finding:
    """One place of a route where consecutive prompts of a template differ."""

    section: str
    character: int  # offset in the section's content
    prompt_offset: int  # offset in the rendered prompt text
    kind: str
    requests: int
    group_requests: int
    shared_blocks: int
    total_blocks: int
    estimated: bool
    context: str


@dataclass(frozen=True, slots=True)
class RouteReport:
    """One route: its requests, score (None: no full block), groups and findings."""

    route: str
    requests: int
    score: float | None
    shared_blocks: int
    total_blocks: int
    groups: int
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the route's report."""
        out = asdict(self)
        out["findings"] = [asdict(f) for f in self.findings]
        return out


def _pseudo(body: Any, rendered: Rendered) -> list[int]:
    return pseudo_tokens(rendered.text)


@dataclass(slots=True)
class _Sample:
    offset: int
    prompt_offset: int
    requests: set[int]
    blocks: list[tuple[int, int]]
    estimated: bool
    context: str


def _route_report(
    route: str, bodies: list[Any], block_size: int, tokens_of: TokenFn, window: int
) -> RouteReport:
    tracker = PrefixTracker(window=max(1, window), block_size=block_size)
    rendered = [render_body(b) for b in bodies]
    hashes: list[list[bytes]] = []
    ntok: list[int] = []
    for body, r in zip(bodies, rendered, strict=True):
        toks = tokens_of(body, r)
        hashes.append(block_hashes(toks, block_size))
        ntok.append(len(toks))
        tracker.observe_hashes(route, hashes[-1], len(toks))
    groups: defaultdict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rendered):
        groups[fingerprint(r)].append(i)
    found: dict[tuple[str, str, int], _Sample] = {}
    group_of_key: defaultdict[tuple[str, str, int], set[str]] = defaultdict(set)
    for key_fp, members in groups.items():
        for prev, cur in itertools.pairwise(members):
            a, b = rendered[prev], rendered[cur]
            for k, site in enumerate(sites(a, b)):
                if site.section.startswith("last message"):
                    continue
                if k == 0:
                    shared = shared_leading_blocks(hashes[prev], hashes[cur], ntok[cur], block_size)
                else:
                    before = ntok[cur] * site.b_start // max(1, len(b.text))
                    shared = min(before // block_size, hit_blocks(ntok[cur], block_size))
                key = (site.section, site.kind, site.section_offset)
                sample = found.get(key)
                if sample is None:
                    ctx = context(b, site.b_start, site.b_end, site.kind)
                    sample = found[key] = _Sample(
                        site.section_offset, site.b_start, set(), [], False, ctx
                    )
                sample.requests.update((prev, cur))
                sample.blocks.append((shared, len(hashes[cur])))
                sample.estimated |= k > 0
                group_of_key[key].add(key_fp)
    findings = _merge(found, group_of_key, groups)
    stats = tracker.stats(route)
    return RouteReport(
        route,
        len(bodies),
        stats.score if stats else None,
        stats.shared_blocks if stats else 0,
        stats.total_blocks if stats else 0,
        len(groups),
        tuple(sorted(findings, key=lambda f: (f.prompt_offset, f.section))),
    )


def _merge(
    found: dict[tuple[str, str, int], _Sample],
    group_of_key: dict[tuple[str, str, int], set[str]],
    groups: dict[str, list[int]],
) -> list[Finding]:
    out: list[Finding] = []
    cluster: list[tuple[str, str, int]] = []

    def flush() -> None:
        if not cluster:
            return
        best = max(cluster, key=lambda k: len(found[k].blocks))
        requests: set[int] = set()
        blocks: list[tuple[int, int]] = []
        fps: set[str] = set()
        for k in cluster:
            requests |= found[k].requests
            blocks += found[k].blocks
            fps |= group_of_key[k]
        s = found[best]
        out.append(
            Finding(
                best[0],
                s.offset,
                s.prompt_offset,
                best[1],
                len(requests),
                sum(len(groups[fp]) for fp in fps),
                int(statistics.median_low([b[0] for b in blocks])),
                int(statistics.median_low([b[1] for b in blocks])),
                any(found[k].estimated for k in cluster),
                s.context,
            )
        )
        cluster.clear()

    for key in sorted(found):
        if cluster and (key[:2] != cluster[0][:2] or key[2] - cluster[0][2] > MERGE_CHARS):
            flush()
        cluster.append(key)
    flush()
    return out


def build_report(
    records: Iterable[tuple[str, Any]],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    tokens_of: TokenFn | None = None,
    window: int | None = None,
) -> list[RouteReport]:
    """Reports of every route in ``records`` (route, decoded body), in first-seen order.
    ``tokens_of`` makes a body's token ids (default: pseudo-tokens of the rendered text);
    ``window``: the score's window (default: every request of the route)."""
    by_route: dict[str, list[Any]] = {}
    for route, body in records:
        by_route.setdefault(route, []).append(body)
    fn = tokens_of or _pseudo
    return [
        _route_report(route, bodies, block_size, fn, window or len(bodies))
        for route, bodies in by_route.items()
    ]


_SUBJECT = {
    "timestamp": "a value like <timestamp>",
    "id": "a value like <id> (a request id or uuid)",
    "email": "an email address",
    "number": "a number",
    "name": "a name-like word",
    "word": "a word",
    "tools_order": "the order of the tools array",
    "tools_keys": "the key order inside the tools array",
    "tools_changed": "the tools array",
    "text": "the text (another prompt or history)",
}


def format_text(reports: list[RouteReport], block_size: int, token_source: str) -> str:
    """The human-readable report (one line per route, two per finding)."""
    lines: list[str] = []
    for rep in reports:
        score = "n/a" if rep.score is None else f"{rep.score:.2f}"
        lines.append(
            f"route {rep.route}: {rep.requests:,} requests, prefix stability {score} "
            f"({rep.shared_blocks:,} of {rep.total_blocks:,} blocks reusable; block size "
            f"{block_size}, {token_source}; {rep.groups:,} template group"
            f"{'' if rep.groups == 1 else 's'})"
        )
        if not rep.findings:
            lines.append(f"route {rep.route}: no place found where prompts of a template differ")
        for f in rep.findings:
            often = "on every request" if f.requests >= f.group_requests else "on some requests"
            about = "about " if f.estimated else ""
            lines.append(
                f"route {rep.route}: {f.section}, character {f.character}: {_SUBJECT[f.kind]} "
                f"changes {often} ({f.requests:,} of {f.group_requests:,} requests); prefix "
                f"cache could reuse {about}{f.shared_blocks:,} of {f.total_blocks:,} blocks"
            )
            lines.append(f'    context: "{f.context}"')
    return "\n".join(lines)
