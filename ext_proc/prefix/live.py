"""The live side of prefix tracking, as a running ICE exports it (``prefix_tracking`` on).

- ``ice_prefix_stability_score{route, tenant}``: ``PrefixTracker``'s score of the sampled
  requests, per route and (``prefix_tracking.tenant_header``) tenant: the first
  ``max_tenants`` tenants a worker sees get their own label, later ones ``other``, none "".
- ``ice_system_prompt_complexity_score{route}``: the last sampled request's
  ``ext_proc.sysprompt.complexity.system_prompt_complexity``.
- ``ice_prefix_divergence_character{route, section, kind}``: where the route's recent sampled
  prompts first differ (the same finding ``ice prefix-report`` gives over recorded
  requests), the character offset in that section; ``-1`` once that place is no longer seen.
  Recomputed every ``REPORT_EVERY`` samples of a route over its last ``REPORT_EVERY``
  sampled bodies, in the request path (about 5 ms for 16 bodies).

Invariants: label values are bounded (sections are ``system prompt``, ``tools``, ``prompt``,
``message 1`` … ``message 8``, ``message 9+``; kinds are ``report``'s; tenants are at most
``max_tenants`` values seen, then ``other``); no prompt text is exported or logged; memory
is bounded: the tracker's bound, plus at most ``MAX_ROUTES`` routes × ``REPORT_EVERY``
bodies of at most ``MAX_SAMPLE_BYTES``.
"""

from __future__ import annotations

import collections
from typing import Any

from ext_proc import telemetry
from ext_proc.prefix.blocks import pseudo_tokens
from ext_proc.prefix.render import render_body
from ext_proc.prefix.report import build_report
from ext_proc.prefix.tracker import PrefixTracker

__all__ = [
    "MAX_ROUTES",
    "MAX_SAMPLE_BYTES",
    "REPORT_EVERY",
    "LivePrefix",
    "metric_section",
    "prompt_ids",
]

REPORT_EVERY = 16  # sampled bodies per route a divergence report is made over
MAX_SAMPLE_BYTES = 16 * 1024  # larger bodies count in the score but are not kept
MAX_ROUTES = 16
SECTIONS = ("system prompt", "tools", "prompt")


def metric_section(section: str) -> str:
    """A report's section as a bounded label value."""
    if section in SECTIONS:
        return section
    if section.startswith("message "):
        number = section.split()[1]
        if number.isdigit() and int(number) <= 8:
            return f"message {number}"
        return "message 9+"
    return "other"


class LivePrefix:
    """Observes sampled requests and keeps the three gauges (see the module docstring)."""

    def __init__(
        self, tracker: PrefixTracker, sample_every: int, max_tokens: int, max_tenants: int = 16
    ) -> None:
        self.tracker = tracker
        self.sample_every = sample_every
        self.max_tokens = max_tokens
        self.max_tenants = max_tenants
        self._tenants: set[str] = set()
        self.seen = 0
        self._samples: collections.OrderedDict[str, collections.deque[Any]] = (
            collections.OrderedDict()
        )
        self._since_report: dict[str, int] = {}
        self._exported: dict[str, set[tuple[str, str]]] = {}

    def observe(
        self,
        route: str,
        values: Any,
        nbytes: int,
        weight: float | None,
        tokens: list[int] | None = None,
        tenant: str = "",
    ) -> bool:
        """Count one request; True when it was sampled (and observed). ``tokens``: the
        prompt's exact ids (a configured tokenizer); None: pseudo-tokens of its text.
        ``tenant``: its tenant header's value ("" when the policy names none)."""
        self.seen += 1
        if self.seen % self.sample_every:
            return False
        label = self.tenant_label(tenant)
        key = f"{route}\x00{label}"  # the tracker's table: one per route and tenant
        if tokens is None:
            tokens = pseudo_tokens(render_body(values).text, max_tokens=self.max_tokens)
        else:
            tokens = tokens[: self.max_tokens]
        self.tracker.observe(key, tokens)
        score = self.tracker.scores().get(key)
        if score is not None:
            telemetry.PREFIX_STABILITY.labels(route=route, tenant=label).set(score)
        if weight is not None:
            telemetry.SYSTEM_PROMPT_COMPLEXITY.labels(route=route).set(weight)
        if nbytes <= MAX_SAMPLE_BYTES:
            self._keep(route, values)
        return True

    @classmethod
    def for_spec(cls, spec: Any, carried: LivePrefix | None = None) -> LivePrefix:
        """The live tracking a policy's ``prefix_tracking`` asks for; ``carried``: the one of
        the policy it replaces, kept (with its history) when the settings are the same."""
        if carried is not None:
            return carried
        from ext_proc.prefix.tracker import PrefixTracker

        tracker = PrefixTracker(spec.capacity_blocks, spec.window, block_size=spec.block_size)
        return cls(tracker, spec.sample_every, spec.max_tokens, spec.max_tenants)

    def observe_request(
        self,
        route: str,
        values: Any,
        features: Any,
        nbytes: int,
        tenant: str,
        counters: Any,
    ) -> bool:
        """``observe`` for the pipeline: a request that is not sampled costs a counter; a
        sampled one also gets its system prompt's weight and, when its model has a
        tokenizer with a chat template (``counters``), its exact prompt ids."""
        if (self.seen + 1) % self.sample_every:
            self.seen += 1
            return False
        from ext_proc.sysprompt.complexity import system_prompt_complexity

        weight = system_prompt_complexity(values, features.schema, features).score
        ids = prompt_ids(counters, values, features)
        return self.observe(route, values, nbytes, weight, ids, tenant)

    def tenant_label(self, tenant: str) -> str:
        """The tenant's label: its own for the first ``max_tenants`` seen, else ``other``."""
        if not tenant:
            return ""
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self.max_tenants and len(tenant) <= 64:
            self._tenants.add(tenant)
            return tenant
        return "other"

    def _keep(self, route: str, values: Any) -> None:
        samples = self._samples.get(route)
        if samples is None:
            if len(self._samples) >= MAX_ROUTES:
                old, _ = self._samples.popitem(last=False)
                self._since_report.pop(old, None)
            samples = self._samples[route] = collections.deque(maxlen=REPORT_EVERY)
        self._samples.move_to_end(route)
        samples.append(values)
        self._since_report[route] = self._since_report.get(route, 0) + 1
        if len(samples) == REPORT_EVERY and self._since_report[route] >= REPORT_EVERY:
            self._since_report[route] = 0
            self._report(route, list(samples))

    def _report(self, route: str, bodies: list[Any]) -> None:
        (report,) = build_report([(route, b) for b in bodies], block_size=self.tracker.block_size)
        now: dict[tuple[str, str], int] = {}
        for finding in report.findings:
            key = (metric_section(finding.section), finding.kind)
            now.setdefault(key, finding.character)
        for section, kind in self._exported.get(route, set()) - set(now):
            telemetry.PREFIX_DIVERGENCE.labels(route=route, section=section, kind=kind).set(-1)
        for (section, kind), character in now.items():
            telemetry.PREFIX_DIVERGENCE.labels(route=route, section=section, kind=kind).set(
                character
            )
        self._exported[route] = self._exported.get(route, set()) | set(now)


def prompt_ids(counters: Any, values: Any, features: Any) -> list[int] | None:
    """A chat prompt's exact token ids when its model has a tokenizer with a template (as
    vLLM renders and tokenizes it); None otherwise (pseudo-tokens then)."""
    counter = counters.counter_for(features.model) if counters else None
    messages = values.get("messages") if isinstance(values, dict) else None
    if counter is None or not counter.has_chat_template or features.schema != "openai.chat":
        return None
    if not isinstance(messages, list):
        return None
    try:
        ids: list[int] = counter.token_ids(counter.render_chat(messages, tools=values.get("tools")))
    except Exception:  # a template that refuses the body: pseudo-tokens then
        return None
    return ids
