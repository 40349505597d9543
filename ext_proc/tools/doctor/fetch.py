"""The doctor's only HTTP client: GET a URL, return its body as text, or say why not.

Job: ``http_get(url, timeout_s)`` and the ``Fetch`` signature the checks take (tests hand
the checks a function over recorded pages instead of a network).

Invariants: ``http_get`` raises only ``FetchError``, whose message is one line an operator
can act on ("connection refused", "HTTP 404", "timed out after 3 s"); the body is decoded
as UTF-8 with invalid bytes replaced.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Callable

__all__ = ["Fetch", "FetchError", "http_get"]

Fetch = Callable[[str, float], str]


class FetchError(Exception):
    """A URL could not be read; the message says why, in one line."""


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        inner = e.reason
        if isinstance(inner, ConnectionRefusedError):
            return "connection refused"
        if isinstance(inner, TimeoutError | socket.timeout):
            return "timed out"
        return str(getattr(inner, "strerror", None) or inner)
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, TimeoutError | socket.timeout):
        return "timed out"
    return str(getattr(e, "strerror", None) or e) or type(e).__name__


def http_get(url: str, timeout_s: float) -> str:
    """GET ``url``; ``FetchError`` for anything but a 200 with a readable body."""
    try:
        req = urllib.request.Request(url, headers={"Accept": "text/plain, application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body: bytes = resp.read()
    except ValueError as e:  # not a URL
        raise FetchError(f"{url}: {e}") from None
    except (OSError, urllib.error.HTTPError) as e:
        reason = _reason(e)
        if reason == "timed out":
            reason = f"timed out after {timeout_s:g} s"
        raise FetchError(f"{url}: {reason}") from None
    return body.decode("utf-8", errors="replace")
