"""What a correct deployment looks like: the names and settings ICE needs from Envoy, taken
from the code that generates the shipped configs (``ext_proc.tools.envoygen.pieces``), plus the
paths and policy facts of this deployment (``Expected``).

Job: one place where the doctor learns what to look for, so that no check retypes a name
that ``pieces`` defines (filter names, header names, metadata keys, the processing mode,
timeouts, the body limit).

Invariants: ``Expected.judged`` maps each judged path to the ``x-ice-route`` the mesh spec
gives it (None: any name will do, when no spec was read); read-only and passthrough paths
never overlap it; ``Expected.host`` is a host name a client may send (no wildcard) or None;
everything here is computed once, without I/O beyond the files named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ext_proc.policy.settings import Policy
from ext_proc.schemas import ADAPTERS, READ_ONLY_PATHS
from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.spec import Backend

__all__ = [
    "EXT_PROC",
    "HEADER_MUTATION",
    "MAX_BODY_BYTES",
    "MODE_DEFAULTS",
    "PROFILE_KEY",
    "ROUTER",
    "ROUTE_KEY",
    "Expected",
    "expected",
    "ice_mode",
]

EXT_PROC = pieces.EXT_PROC
HEADER_MUTATION = pieces.HEADER_MUTATION
ROUTER = pieces.ROUTER
MAX_BODY_BYTES = pieces.MAX_BODY_BYTES
MESSAGE_TIMEOUT_S = pieces.MESSAGE_TIMEOUT.total_seconds()
MAX_MESSAGE_TIMEOUT_S = pieces.MAX_MESSAGE_TIMEOUT.total_seconds()
VERDICT_NAMESPACE = pieces.VERDICT_NAMESPACE
LB_NAMESPACE = pieces.LB_NAMESPACE
ECHOED_HEADERS = pieces.ECHOED_HEADERS
SPOOF_PREFIXES = pieces.SPOOF_PREFIXES
SPOOF_NAMES = pieces.SPOOF_NAMES
_metadata = pieces.judged_route_config("route", "profile").overrides
assert _metadata is not None
ROUTE_KEY, PROFILE_KEY = (m.key for m in _metadata.grpc_initial_metadata)

# What an absent (or DEFAULT) processing-mode field means in Envoy.
MODE_DEFAULTS = {
    "request_header_mode": "SEND",
    "response_header_mode": "SEND",
    "request_trailer_mode": "SKIP",
    "response_trailer_mode": "SKIP",
    "request_body_mode": "NONE",
    "response_body_mode": "NONE",
}
DEFAULT_MESH = Path(__file__).resolve().parents[3] / "envoy" / "mesh.yaml"


def normal_mode(mode: dict[str, Any]) -> dict[str, str]:
    """A processing mode with every field spelled out (absent / DEFAULT → Envoy's default)."""
    out = {}
    for key, default in MODE_DEFAULTS.items():
        value = str(mode.get(key, default))
        out[key] = default if value == "DEFAULT" else value
    return out


def ice_mode() -> dict[str, str]:
    """The processing mode of ICE's ext_proc filter (``pieces.ext_proc_config``)."""
    config = as_dict(pieces.ext_proc_config("ice"))
    return normal_mode(config.get("processing_mode", {}))


@dataclass(frozen=True, slots=True)
class Expected:
    """This deployment: its policy (as given to the doctor) and its paths."""

    policy: Policy
    policy_source: str  # the --policy path, or "built-in default"
    policy_bytes: bytes  # the file's bytes (for ICE's ice_policy_info sha256)
    judged: dict[str, str | None]  # path → x-ice-route expected (None: any)
    read_only: tuple[str, ...]
    mesh_source: str  # "envoy/mesh.yaml", or "built-in judged paths"
    # The Host the doctor routes as (the spec's first gateway host without a wildcard; None:
    # the ``*`` virtual host), and the spec's backend (None: no spec was read).
    host: str | None = None
    backend: Backend | None = None

    @property
    def passthrough(self) -> tuple[str, ...]:
        return tuple(sorted(self.policy.passthrough_paths))

    def extension_ms(self) -> int | None:
        """The longest message timeout ICE asks Envoy for, less its 1 s margin: a truncating
        profile's ``deadline_ms`` or a queueing profile's ``max_queue_wait_ms`` (None: no
        profile does either)."""
        waits = [p.truncation.deadline_ms for p in self.policy.profiles.values() if p.truncation]
        waits += [p.queue.max_queue_wait_ms for p in self.policy.profiles.values() if p.queue]
        return max(waits) if waits else None

    def fail_closed_profiles(self) -> list[str]:
        return sorted(n for n, p in self.policy.profiles.items() if p.fail_mode == "closed")


def expected(
    policy: Policy,
    policy_source: str,
    policy_bytes: bytes,
    mesh: Path | None,
) -> Expected:
    """``mesh``: a mesh spec (``envoy/mesh.yaml``) naming the judged paths and their routes;
    None: the spec shipped beside the code when there is one, else the judged endpoints ICE
    knows (``ext_proc.schemas.ADAPTERS``, and SGLang's ``/generate``) with any route name."""
    from ext_proc.tools.envoygen.spec import load_spec

    path = mesh if mesh is not None else (DEFAULT_MESH if DEFAULT_MESH.exists() else None)
    if path is not None:
        spec = load_spec(path)  # SpecError: the caller reports it
        return Expected(
            policy=policy,
            policy_source=policy_source,
            policy_bytes=policy_bytes,
            judged={r.path: r.name for r in spec.routes},
            read_only=spec.read_only,
            mesh_source=str(path),
            host=next((h for h in spec.gateway.hosts if "*" not in h), None),
            backend=spec.backend,
        )
    judged: dict[str, str | None] = dict.fromkeys([*ADAPTERS, "/generate"])
    return Expected(
        policy=policy,
        policy_source=policy_source,
        policy_bytes=policy_bytes,
        judged=judged,
        read_only=tuple(sorted(READ_ONLY_PATHS)),
        mesh_source="built-in judged paths",
    )
