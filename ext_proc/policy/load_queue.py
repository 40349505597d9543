"""Policy loading for the admission queue: a profile's ``queue`` block → ``QueueSpec`` (see
load.py for the file as a whole). Every problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

import re

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.policy.settings import QueueSpec

__all__ = ["MAX_QUEUE_WAIT_MS", "queue_spec"]

# Envoy's max_message_timeout in the generated configuration is 60 s (envoygen.pieces); ICE
# asks for the wait plus a margin of 1 s.
MAX_QUEUE_WAIT_MS = 59_000
_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")


def queue_spec(msg: policy_pb2.Queue, where: str) -> QueueSpec | None:
    """The profile's queue, or None when it is off."""
    if not msg.enabled:
        return None
    d = QueueSpec()
    wait = opt(msg, "max_queue_wait_ms", d.max_queue_wait_ms)
    if not 1 <= wait <= MAX_QUEUE_WAIT_MS:
        raise PolicyError(
            f"{where}.max_queue_wait_ms: must be in 1..{MAX_QUEUE_WAIT_MS} (Envoy's "
            f"max_message_timeout is 60 s), got {wait}"
        )
    length = opt(msg, "max_queue_length", d.max_queue_length)
    tenants = opt(msg, "max_tenants", d.max_tenants)
    poll = opt(msg, "poll_ms", d.poll_ms)
    for name, value in (("max_queue_length", length), ("max_tenants", tenants), ("poll_ms", poll)):
        if value < 1:
            raise PolicyError(f"{where}.{name}: must be ≥ 1, got {value}")
    if poll > wait:
        raise PolicyError(f"{where}.poll_ms: must be ≤ max_queue_wait_ms ({wait}), got {poll}")
    header = msg.tenant_header.strip().lower()
    if header and not _HEADER.match(header):
        raise PolicyError(f"{where}.tenant_header: not a header name: {msg.tenant_header!r}")
    critical = msg.critical.strip() or d.critical
    if critical not in ("pass", "wait"):
        raise PolicyError(f"{where}.critical: must be pass or wait, got {msg.critical!r}")
    return QueueSpec(
        critical="wait" if critical == "wait" else "pass",
        max_queue_wait_ms=wait,
        max_queue_length=length,
        tenant_header=header,
        max_tenants=tenants,
        poll_ms=poll,
    )
