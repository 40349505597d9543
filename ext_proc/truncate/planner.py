"""Which turns to keep within a token budget, and the body that keeps them (pure).

The plan, for a ``Conversation`` and a budget in tokens:
1. Every unit with a ``keep`` reason stays (system messages, the current turn, the last K
   turns, pinned turns). When they alone, with the tokens outside ``messages``, exceed the
   budget, the result is ``Overflow``: the caller answers 400 (or sends the must-keep set,
   when the profile says ``on_overflow: best_effort``).
2. *Semantic* (similarities given, one per unit: the highest cosine similarity of any of its
   messages to the latest user message): units at or above ``threshold`` are taken first,
   most similar first; then the rest, most similar first (``fill: similarity``) or newest
   first (``fill: recency``). A unit is taken when it still fits the budget; a larger one
   that does not fit is skipped and smaller ones after it may still fit (greedy by rank).
3. *Recency* (no similarities: the embedding worker was late, down, or the question has no
   text): the droppable units newest first, same greedy fill.
4. With a ``placeholder`` text, each run of dropped messages is replaced by one message
   ``{"role": placeholder_role, "content": text}`` (``{messages}`` and ``{tokens}`` in the
   text are the run's dropped messages and tokens); placeholders count against the budget,
   and the lowest-ranked taken unit is given back until they fit.

Token figures are the estimator's (``units``); ``Plan.saved_tokens`` is the dropped units'
tokens less the placeholders'. The body edit splices the original ``messages`` elements, so
every kept message reaches the backend byte for byte, in its original order.

Invariant: the plan never drops a unit with a keep reason and never splits a unit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ext_proc.schemas import rawjson
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, estimate_text_tokens
from ext_proc.truncate.units import Conversation

__all__ = ["Overflow", "Plan", "PlanRules", "apply_plan", "plan_truncation"]

Fill = Literal["similarity", "recency"]


@dataclass(frozen=True, slots=True)
class PlanRules:
    """How droppable units are ranked, and what replaces a dropped run."""

    threshold: float = 0.35
    fill: Fill = "similarity"
    placeholder: str = ""  # "" = no placeholder message
    placeholder_role: str = ""  # "" = system (OpenAI) / user (Anthropic)


@dataclass(frozen=True, slots=True)
class Run:
    """Dropped messages in a row: replaced by one placeholder before ``before`` (a message
    index of the original body) when the rules ask for placeholders."""

    before: int
    messages: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What to keep. ``kept_units`` are positions in ``Conversation.units``."""

    kept_units: tuple[int, ...]
    kept_messages: tuple[int, ...]
    dropped_messages: int
    saved_tokens: int
    tokens_after: int
    mode: Literal["semantic", "recency", "must_keep"]
    runs: tuple[Run, ...]
    placeholder: str = ""
    placeholder_role: str = ""

    @property
    def changed(self) -> bool:
        return self.dropped_messages > 0


@dataclass(frozen=True, slots=True)
class Overflow:
    """The must-keep units alone exceed the budget."""

    must_keep_tokens: int
    budget_tokens: int


def _placeholder_text(template: str, run: Run) -> str:
    return template.replace("{messages}", str(run.messages)).replace("{tokens}", str(run.tokens))


def _runs(conv: Conversation, kept: set[int]) -> list[Run]:
    runs: list[Run] = []
    count = tokens = 0
    for k, unit in enumerate(conv.units):
        if k in kept:
            if count:
                runs.append(Run(unit.indexes[0], count, tokens))
                count = tokens = 0
        else:
            count += len(unit.indexes)
            tokens += unit.tokens
    if count:
        runs.append(Run(conv.message_count, count, tokens))
    return runs


def _placeholder_tokens(template: str, runs: list[Run]) -> int:
    if not template:
        return 0
    return sum(
        PER_MESSAGE_TOKENS + estimate_text_tokens(_placeholder_text(template, r)) for r in runs
    )


def plan_truncation(
    conv: Conversation,
    budget_tokens: int,
    similarities: Sequence[float] | None,
    rules: PlanRules,
) -> Plan | Overflow:
    """Plan the kept units (see the module docstring)."""
    units = conv.units
    must = [k for k, u in enumerate(units) if u.keep is not None]
    used = conv.fixed_tokens + sum(units[k].tokens for k in must)
    if used > budget_tokens:
        return Overflow(used, budget_tokens)
    free = [k for k, u in enumerate(units) if u.keep is None]
    if similarities is None:
        order = sorted(free, reverse=True)
        mode: Literal["semantic", "recency"] = "recency"
    else:
        sims = similarities
        above = sorted((k for k in free if sims[k] >= rules.threshold), key=lambda k: -sims[k])
        rest = [k for k in free if sims[k] < rules.threshold]
        if rules.fill == "recency":
            rest.sort(reverse=True)
        else:
            rest.sort(key=lambda k: -sims[k])
        order = above + rest
        mode = "semantic"
    taken: list[int] = []
    for k in order:
        if used + units[k].tokens <= budget_tokens:
            taken.append(k)
            used += units[k].tokens
    kept = set(must) | set(taken)
    runs = _runs(conv, kept)
    extra = _placeholder_tokens(rules.placeholder, runs)
    while extra and used + extra > budget_tokens and taken:
        k = taken.pop()  # the lowest-ranked unit taken gives its room back
        kept.discard(k)
        used -= units[k].tokens
        runs = _runs(conv, kept)
        extra = _placeholder_tokens(rules.placeholder, runs)
    if extra and used + extra > budget_tokens:
        return Overflow(used + extra, budget_tokens)
    kept_units = tuple(sorted(kept))
    kept_messages = tuple(sorted(i for k in kept_units for i in units[k].indexes))
    dropped = conv.message_count - len(kept_messages)
    total = conv.total_tokens
    return Plan(
        kept_units=kept_units,
        kept_messages=kept_messages,
        dropped_messages=dropped,
        saved_tokens=total - used - extra,
        tokens_after=used + extra,
        mode=mode,
        runs=tuple(runs),
        placeholder=rules.placeholder if dropped else "",
        placeholder_role=rules.placeholder_role or _default_role(conv.schema),
    )


def _default_role(schema: str) -> str:
    # Anthropic has no system role inside messages; consecutive user messages are merged
    # by the API, so a user placeholder before a kept turn (which starts with a user
    # message) keeps the alternation.
    return "user" if schema == "anthropic.messages" else "system"


def apply_plan(body: bytes, plan: Plan) -> bytes:
    """The body with only the kept messages (and placeholders), every other byte as sent."""
    return apply_plan_doc(rawjson.parse_object(body), plan).text.encode("utf-8")


def apply_plan_doc(doc: rawjson.TopLevel, plan: Plan) -> rawjson.TopLevel:
    """``apply_plan`` on a decoded body: the shorter body's text and values, with no second
    parse (the element spans come from the decode when it walked ``messages``)."""
    spans = doc.items.get("messages")
    if spans is None:
        items = rawjson.array_items(doc, "messages")
    else:
        items = [doc.text[s:e] for s, e in spans]
    old: Any = doc.values.get("messages")
    known = isinstance(old, list)
    inserts: dict[int, tuple[str, dict[str, str]]] = {}
    if plan.placeholder:
        for run in plan.runs:
            message = {
                "role": plan.placeholder_role,
                "content": _placeholder_text(plan.placeholder, run),
            }
            inserts[run.before] = (json.dumps(message, ensure_ascii=False), message)
    out: list[str] = []
    values: list[Any] = []
    for i in plan.kept_messages:
        if i in inserts:
            text, message = inserts.pop(i)
            out.append(text)
            values.append(message)
        out.append(items[i])
        values.append(old[i] if known else None)
    for text, message in inserts.values():  # a run at the very end (cannot happen: the
        out.append(text)  # current turn stays)
        values.append(message)
    start, end = doc.spans["messages"]
    new = {**doc.values, "messages": values if known else old}
    shorter = rawjson.splice(doc, [(start, end, "[" + ", ".join(out) + "]")], new)
    kept = {k: v for k, v in shorter.items.items() if k != "messages"}
    return rawjson.TopLevel(shorter.text, shorter.values, shorter.spans, shorter.close_index, kept)
