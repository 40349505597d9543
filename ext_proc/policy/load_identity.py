"""Policy loading for identity: a profile's or route's ``identity`` block → ``IdentitySpec``
(docs/identity.md; see load.py for the file as a whole). Every problem raises
``PolicyError`` naming the field.

Defaults: ``source: trust`` (the client's tenant headers, as before identity sources);
``required`` is true for ``jwt``, ``mtls`` and ``header`` and false for ``trust``; ``claim``
``sub``; ``san`` ``uri``. ``source: jwt`` needs ``jwt.issuer`` (the generated configs verify
tokens of that issuer); ``source: header`` needs ``header``.
"""

from __future__ import annotations

import re

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.settings import IdentitySpec, JwtProviderSpec

__all__ = ["identity_spec"]

_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
_CLAIM = re.compile(r"^[A-Za-z0-9_:/\-]+(\.[A-Za-z0-9_:/\-]+)*$")
_KEY = re.compile(r"^[^\s]+$")
# headers a trusted service may not claim: Envoy's pseudo-headers and ICE's own
_RESERVED = (":", "x-ice-", "x-mem-pressure", "x-envoy-")


def _header(text: str, where: str) -> str:
    header = text.strip().lower()
    if header and not _HEADER.match(header):
        raise PolicyError(f"{where}: not a header name: {text!r}")
    if header.startswith(_RESERVED):
        raise PolicyError(f"{where}: {header!r} is reserved (Envoy's or ICE's own)")
    return header


def _jwt(msg: policy_pb2.IdentityJwt, where: str) -> JwtProviderSpec:
    issuer = msg.issuer.strip()
    if not issuer:
        raise PolicyError(f"{where}.issuer: required with source: jwt (the token's iss)")
    if msg.jwks_file and msg.jwks_uri:
        raise PolicyError(f"{where}: give jwks_file or jwks_uri, not both")
    if msg.jwks_uri and not msg.jwks_uri.startswith(("https://", "http://")):
        raise PolicyError(f"{where}.jwks_uri: not an http(s) URL: {msg.jwks_uri!r}")
    key = msg.metadata_key.strip() or JwtProviderSpec().metadata_key
    if not _KEY.match(key):
        raise PolicyError(f"{where}.metadata_key: {msg.metadata_key!r} holds whitespace")
    audiences = tuple(a.strip() for a in msg.audiences)
    if any(not a for a in audiences):
        raise PolicyError(f"{where}.audiences: an empty audience")
    return JwtProviderSpec(
        issuer=issuer,
        audiences=audiences,
        jwks_file=msg.jwks_file.strip(),
        jwks_uri=msg.jwks_uri.strip(),
        metadata_key=key,
    )


def identity_spec(msg: policy_pb2.Identity, where: str) -> IdentitySpec:
    """The identity block at ``where`` (an unset block: ``IdentitySpec()``, trust)."""
    source = msg.source.strip() or "trust"
    if source not in ("jwt", "mtls", "header", "trust"):
        raise PolicyError(f"{where}.source: must be jwt, mtls, header or trust, got {source!r}")
    claim = msg.claim.strip() or IdentitySpec().claim
    if not _CLAIM.match(claim):
        raise PolicyError(f"{where}.claim: not a claim name or dotted path: {msg.claim!r}")
    header = _header(msg.header, f"{where}.header")
    san = msg.san.strip() or "uri"
    if san not in ("uri", "dns"):
        raise PolicyError(f"{where}.san: must be uri or dns, got {msg.san!r}")
    if source == "header" and not header:
        raise PolicyError(
            f"{where}.header: required with source: header (the header the ext_authz service sets)"
        )
    has_jwt = msg.HasField("jwt")
    if has_jwt and source != "jwt":
        raise PolicyError(f"{where}.jwt: only with source: jwt")
    if source == "jwt" and not has_jwt:
        raise PolicyError(f"{where}.jwt: required with source: jwt (its issuer, audiences, keys)")
    for name, used in (("claim", source == "jwt"), ("san", source == "mtls")):
        if getattr(msg, name).strip() and not used:
            raise PolicyError(f"{where}.{name}: means nothing with source: {source}")
    if header and source not in ("header", "trust"):
        raise PolicyError(f"{where}.header: means nothing with source: {source}")
    required = msg.required if msg.HasField("required") else source != "trust"
    return IdentitySpec(
        source="jwt"
        if source == "jwt"
        else "mtls"
        if source == "mtls"
        else "header"
        if source == "header"
        else "trust",
        claim=claim,
        header=header,
        required=required,
        san="dns" if san == "dns" else "uri",
        jwt=_jwt(msg.jwt, f"{where}.jwt") if source == "jwt" else None,
    )
