"""Endpoint picking: where in a pool a request is judged, and (``endpoint_pick: ice``) where
it is sent. Pure: no I/O, no clock.

- ``endpoint_of``: a backend's serving address ``host:port``: the pool's
  ``backend_endpoints`` entry for its metrics URL, else the URL's own host and port (vLLM
  and SGLang serve ``/metrics`` on their API port), else the source name as it is (a
  Prometheus ``instance`` label is already ``host:port``).
- ``prefix_key``: what makes two requests share a cached prefix: the system prompt(s) and
  tools of a chat (OpenAI, Anthropic, Responses ``instructions``), or the first 512
  characters of a completions prompt, hashed (blake2b, 16 bytes); None when a request has
  no such prefix.
- ``Affinity``: prefix key → the endpoint that prefix was last sent to; at most
  ``MAX_AFFINITY`` keys (least recently used go first), and ``forget`` drops endpoints that
  left the pool.
- ``pick``: the endpoint for a request among the candidates (see its docstring).

Invariant: ``pick`` only returns an endpoint where the request fits, or None; the caller
judges a request that fits nowhere against the endpoint with the most room.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "DESTINATION_HEADER",
    "MAX_AFFINITY",
    "Affinity",
    "Candidate",
    "endpoint_of",
    "pick",
    "prefix_key",
]

# The endpoint-picker protocol's header (and key in the envoy.lb metadata namespace).
DESTINATION_HEADER = "x-gateway-destination-endpoint"
MAX_AFFINITY = 4096
_PROMPT_PREFIX_CHARS = 512
_SYSTEM_ROLES = ("system", "developer")


def endpoint_of(url: str, overrides: Mapping[str, str] | None = None) -> str:
    """The serving address of the backend whose metrics are at ``url`` (module docstring)."""
    if overrides and url in overrides:
        return overrides[url]
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.hostname is None:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


def prefix_key(schema: str, body: Mapping[str, Any]) -> str | None:
    """The hash of a request's shareable prefix (module docstring), or None."""
    parts: list[Any] = []
    if schema in ("openai.chat", "openai.chat_batch"):
        messages = body.get("messages")
        if isinstance(messages, list) and schema == "openai.chat_batch":
            messages = messages[0] if messages and isinstance(messages[0], list) else []
        if isinstance(messages, list):
            for msg in messages:
                if not isinstance(msg, dict) or msg.get("role") not in _SYSTEM_ROLES:
                    break
                parts.append(msg.get("content"))
    elif schema == "anthropic.messages":
        parts.append(body.get("system"))
    elif schema == "openai.responses":
        parts.append(body.get("instructions"))
    elif schema == "openai.completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            parts.append(prompt[:_PROMPT_PREFIX_CHARS])
    if not any(p is not None for p in parts):
        return None
    tools = body.get("tools")
    text = json.dumps([schema, parts, tools], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class Affinity:
    """Prefix key → the endpoint it was last sent to, bounded (least recently used go)."""

    def __init__(self, size: int = MAX_AFFINITY) -> None:
        self.size = size
        self._table: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def get(self, key: str | None) -> str | None:
        if key is None:
            return None
        endpoint = self._table.get(key)
        if endpoint is not None:
            self._table.move_to_end(key)
        return endpoint

    def put(self, key: str | None, endpoint: str) -> None:
        if key is None:
            return
        self._table[key] = endpoint
        self._table.move_to_end(key)
        while len(self._table) > self.size:
            self._table.popitem(last=False)

    def forget(self, present: Iterable[str]) -> None:
        """Drop the keys of endpoints that are no longer in the pool."""
        keep = set(present)
        for key in [k for k, e in self._table.items() if e not in keep]:
            del self._table[key]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint as the picker sees it: free KV blocks less its in-flight ledger, the
    blocks the request needs there, and its queue (waiting requests; None: unknown)."""

    endpoint: str
    free_blocks: int
    need_blocks: int
    waiting: float | None = None

    @property
    def fits(self) -> bool:
        return self.need_blocks <= self.free_blocks

    @property
    def room_after(self) -> int:
        return self.free_blocks - self.need_blocks


def pick(
    candidates: Iterable[Candidate], affine: str | None = None, prefix: str | None = None
) -> Candidate | None:
    """The endpoint a request goes to, among those where it fits now:
    1. the endpoint its prefix was last sent to (``affine``), when the request fits there;
    2. else the one with the most free blocks left after admitting it;
    3. ties: the shortest queue, then the highest rendezvous hash of (prefix, endpoint), so
       that new prefixes spread over equally good endpoints instead of all landing on the
       first (a request without a prefix: the endpoint's name). Deterministic.
    None when it fits nowhere."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    if affine is not None:
        for c in fitting:
            if c.endpoint == affine:
                return c
    return min(
        fitting,
        key=lambda c: (
            -c.room_after,
            c.waiting if c.waiting is not None else float("inf"),
            -_rendezvous(prefix, c.endpoint) if prefix is not None else 0,
            c.endpoint,
        ),
    )


def _rendezvous(prefix: str, endpoint: str) -> int:
    digest = hashlib.blake2b(f"{prefix}|{endpoint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
