"""The arms of a comparison: a front (direct, ice, queue) and the vLLM it sends to, valve or not.

vLLM 0.32 has an admission valve of its own, two ``vllm serve`` flags checked in its API
server before a request is rendered (``AsyncLLM.check_admission``; both answer 503):

- ``--max-num-queued-reqs N``: 503 when the requests in flight (waiting + running, counted in
  the API server) plus the new one's ``n`` exceed N (``current + n > N``);
- ``--max-num-queued-tokens T``: 503 when the prompt tokens of the requests still in prefill
  (waiting ones included; a request counts its whole prompt until its first token) are
  already ≥ T; the new request's own prompt is not counted, so one request can overshoot T.

Each rejection counts in ``vllm:admission_rejections_total{reason}`` (``max_num_queued_reqs``,
``max_num_queued_tokens``); the 503's body says which (``valve_reason``).

- ``Valve``: one setting (``reqs=4``, ``tokens=2048``) and the ``vllm serve`` flags it adds.
- ``Arm``: a front and a valve or none; its name is what the tables show: ``direct``,
  ``ice``, ``queue`` (no valve), ``valve:reqs=4`` (straight to a vLLM with the valve),
  ``ice+valve:reqs=4`` / ``queue+valve:reqs=4`` (that front before such a vLLM).
- ``parse_arms`` (``--modes``), ``sweep_arms`` (``--valve-reqs`` / ``--valve-tokens`` ×
  ``--valve-with``), ``group_arms``: the arms by the vLLM they need, one ``VllmGroup`` per
  distinct valve (a valve is a server flag: each group gets its own ``vllm serve``), no
  valve first, then reqs and tokens by limit.
- ``valve_in_args``: whether ``vllm serve`` arguments already set a valve flag.

Invariants: pure (no I/O); an arm's name parses back to the same arm (``parse_arm``); limits
are ≥ 1 (a 0 valve refuses everything, warm-up included); the group without a valve comes
first, then the valves in ``valve_sort_key`` order, each group's fronts in the arms' order,
so the default arms (direct, ice) make one group without a valve, started exactly as before
valves existed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ext_proc.lab.overload.burst import MODES

__all__ = [
    "VALVE_FLAGS",
    "VALVE_KINDS",
    "VALVE_REASONS",
    "Arm",
    "Valve",
    "VllmGroup",
    "arm_name",
    "group_arms",
    "parse_arm",
    "parse_arms",
    "parse_limits",
    "short_reason",
    "sweep_arms",
    "valve_in_args",
    "valve_reason",
    "valve_sort_key",
]

VALVE_KINDS = ("reqs", "tokens")
VALVE_FLAGS = {"reqs": "--max-num-queued-reqs", "tokens": "--max-num-queued-tokens"}
# vLLM's `reason` label of vllm:admission_rejections_total, by valve kind.
VALVE_REASONS = {"reqs": "max_num_queued_reqs", "tokens": "max_num_queued_tokens"}
# The message of each 503 (vllm/exceptions.py: QueueOverflowError, MaxQueuedTokensError).
_BODY_MARKS = {
    "reqs": "cannot accept new requests",
    "tokens": "prefill token backlog limit",
}


@dataclass(frozen=True, order=True)
class Valve:
    """One valve setting: ``kind`` (``reqs`` or ``tokens``) and its ``limit`` (≥ 1)."""

    kind: str
    limit: int

    def __post_init__(self) -> None:
        if self.kind not in VALVE_KINDS or self.limit < 1:
            raise ValueError(f"bad valve {self.kind}={self.limit}: want reqs=N or tokens=T, ≥ 1")

    @property
    def name(self) -> str:
        return f"{self.kind}={self.limit}"

    @property
    def vllm_args(self) -> tuple[str, ...]:
        """What ``vllm serve`` gets for it: ``("--max-num-queued-reqs", "4")``."""
        return (VALVE_FLAGS[self.kind], str(self.limit))

    @classmethod
    def parse(cls, spec: str) -> Valve:
        """``"reqs=4"`` → ``Valve("reqs", 4)``; ValueError otherwise."""
        kind, _, limit = spec.strip().partition("=")
        if kind not in VALVE_KINDS or not limit.isdigit():
            raise ValueError(f"bad valve {spec!r}: want reqs=N or tokens=T")
        return cls(kind, int(limit))


def arm_name(mode: str, valve: str = "") -> str:
    """The name of ``mode`` before a vLLM with ``valve`` (a ``Valve.name``; "" for none)."""
    if not valve:
        return mode
    return f"valve:{valve}" if mode == "direct" else f"{mode}+valve:{valve}"


def valve_sort_key(valve: str) -> tuple[int, int]:
    """Order of valve names in the tables: none first, then reqs, then tokens, by limit."""
    if not valve:
        return (0, 0)
    v = Valve.parse(valve)
    return (1 + VALVE_KINDS.index(v.kind), v.limit)


@dataclass(frozen=True)
class Arm:
    """A front (one of ``MODES``) and the valve of the vLLM behind it (None: no valve)."""

    mode: str
    valve: Valve | None = None

    @property
    def name(self) -> str:
        return arm_name(self.mode, self.valve.name if self.valve else "")


_ARM_HELP = (
    f"want {', '.join(MODES)}, valve:reqs=N, valve:tokens=T or "
    "ice+valve:... / queue+valve:... (N, T ≥ 1)"
)


def parse_arm(spec: str) -> Arm:
    """``"ice"`` / ``"valve:reqs=4"`` / ``"ice+valve:tokens=2048"`` → the ``Arm``."""
    text = spec.strip()
    if text in MODES:
        return Arm(text)
    front, plus, rest = text.partition("+")
    if not plus:
        front, rest = "direct", text
    elif front not in MODES or front == "direct":
        raise ValueError(f"bad arm {spec!r}: {_ARM_HELP}")
    tag, _, setting = rest.partition(":")
    if tag != "valve":
        raise ValueError(f"bad arm {spec!r}: {_ARM_HELP}")
    try:
        return Arm(front, Valve.parse(setting))
    except ValueError:
        raise ValueError(f"bad arm {spec!r}: {_ARM_HELP}") from None


def _unique(arms: Sequence[Arm], what: str) -> list[Arm]:
    names = [a.name for a in arms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{what}: each arm once, {', '.join(twice)} repeated")
    return list(arms)


def parse_arms(spec: str) -> list[Arm]:
    """``--modes``: comma-separated arms, in that order, each once; ValueError for a bad or
    repeated one, or none."""
    parts = [p for p in (s.strip() for s in spec.split(",")) if p]
    if not parts:
        raise ValueError(f"bad --modes {spec!r}: {_ARM_HELP}")
    try:
        arms = [parse_arm(p) for p in parts]
    except ValueError as e:
        raise ValueError(f"--modes: {e}") from None
    return _unique(arms, f"bad --modes {spec!r}")


def parse_limits(spec: str | None, flag: str) -> list[int]:
    """``"2,4,8"`` → ``[2, 4, 8]`` (None or "" → []); ValueError for a limit < 1 or twice."""
    if not spec:
        return []
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"bad {flag} {spec!r}: want limits ≥ 1, e.g. 2,4,8")
    limits = [int(p) for p in parts]
    if len(set(limits)) != len(limits):
        raise ValueError(f"bad {flag} {spec!r}: each limit once")
    return limits


def sweep_arms(reqs: Iterable[int], tokens: Iterable[int], fronts: Sequence[str]) -> list[Arm]:
    """One arm per (valve setting, front): every ``reqs`` limit, then every ``tokens`` one,
    each with the ``fronts`` in their order (``direct`` → ``valve:...``)."""
    bad = [f for f in fronts if f not in MODES]
    if bad or not fronts:
        raise ValueError(f"bad --valve-with {','.join(fronts)!r}: want some of {MODES}")
    valves = [Valve("reqs", n) for n in reqs] + [Valve("tokens", t) for t in tokens]
    return [Arm(front, v) for v in valves for front in fronts]


@dataclass(frozen=True)
class VllmGroup:
    """The arms that share one ``vllm serve``: its valve (None: none) and their fronts."""

    valve: Valve | None
    modes: tuple[str, ...]

    @property
    def name(self) -> str:
        """``no valve`` or the valve's name (``reqs=4``)."""
        return self.valve.name if self.valve else "no valve"

    @property
    def arms(self) -> list[Arm]:
        return [Arm(m, self.valve) for m in self.modes]


def group_arms(arms: Sequence[Arm]) -> list[VllmGroup]:
    """The arms by vLLM config (their valve): the group without a valve first, then by
    ``valve_sort_key`` (reqs, then tokens, by limit); fronts in the arms' order; ValueError
    when an arm comes twice."""
    arms = _unique(arms, "arms")
    order: dict[Valve | None, list[str]] = {}
    for arm in arms:
        order.setdefault(arm.valve, []).append(arm.mode)
    groups = [VllmGroup(valve, tuple(modes)) for valve, modes in order.items()]
    return sorted(groups, key=lambda g: valve_sort_key(g.valve.name if g.valve else ""))


def valve_in_args(args: Iterable[str]) -> str | None:
    """The first of ``args`` (``vllm serve`` arguments) that sets a valve flag, else None
    (``--max-num-queued-reqs``, ``--max-num-queued-tokens``, ``=value`` and ``_`` forms)."""
    flags = set(VALVE_FLAGS.values())
    for arg in args:
        head = arg.partition("=")[0]
        if head.startswith("--") and "--" + head[2:].replace("_", "-") in flags:
            return arg
    return None


def valve_reason(body: str | None) -> str:
    """Which valve a 503's body names: ``reqs``, ``tokens``, or ``-`` (another 503: Envoy's
    upstream failure, a dead engine)."""
    text = body or ""
    return next((kind for kind, mark in _BODY_MARKS.items() if mark in text), "-")


def short_reason(reason: str) -> str:
    """vLLM's admission ``reason`` label as the valve kind (``max_num_queued_reqs`` →
    ``reqs``); a label it does not know stays as it is."""
    return next((k for k, r in VALVE_REASONS.items() if r == reason), reason)
