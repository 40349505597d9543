"""Checks of what the routes' identities need from one inference HCM (docs/identity.md).

Job: for each identity source a judged route of the policy uses (a route's binding, else its
profile's; ``trust`` needs nothing), say whether the filter chain gives ICE that identity:

- ``jwt``: a jwt_authn filter before ICE's ext_proc with a provider of the route's issuer that
  writes its payload where ICE reads it (``payload_in_metadata``: the route's
  ``metadata_key``, or the issuer as Envoy Gateway keys it), and ext_proc forwarding
  jwt_authn's namespace. Without them every request of such a route is refused 401
  ``identity_required`` (a required identity), or has no tenant.
- ``mtls``: ext_proc asking for the peer certificate's SAN (``request_attributes``); whether
  the listener requires client certificates is the operator's to check (MANUAL).
- ``header``: an ext_authz filter before ext_proc (it sets the header), and the client's copy
  of the header removed before that filter (a header_mutation filter or Envoy Gateway's early
  header mutation).

Invariants: pure; one ``envoy.identity`` check per source used (none when every route
trusts its client), detail prefixed with the listener's name; names from ``identity_parts``.
"""

from __future__ import annotations

from typing import Any

from ext_proc.policy.settings import IdentitySource, IdentitySpec, Policy
from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import FilterView, HcmView, as_dict, as_list, unwrap
from ext_proc.tools.doctor.envoy_guards import HEADER_MUTATION_TYPE, _mutation_removals
from ext_proc.tools.envoygen.identity_parts import JWT_AUTHN, JWT_NAMESPACE, PEER_ATTRIBUTES

__all__ = ["identity_checks", "route_identities"]

NAME = "envoy.identity"
JWT_TYPE = "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"
EXT_AUTHZ = "envoy.filters.http.ext_authz"
EXT_AUTHZ_TYPE = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
HOW = "docs/identity.md; `ice envoy-config` generates it"


def route_identities(policy: Policy, routes: list[str]) -> dict[str, IdentitySpec]:
    """The identity of each named route that reads one from Envoy (not ``trust``)."""
    out = {}
    for name in routes:
        binding = policy.routes.get(name)
        if binding is None:
            continue
        spec = (
            binding.identity or policy.profiles[binding.profile or policy.default_profile].identity
        )
        if spec.source != "trust":
            out[name] = spec
    return out


def _is(f: FilterView, type_name: str, name: str) -> bool:
    return f.type == type_name or (not f.type and f.name.startswith(name))


def _jwt_check(
    filters: list[FilterView], forwarded: list[str], spec: IdentitySpec, names: str, where: str
) -> Check:
    jwt = spec.jwt
    assert jwt is not None
    found = [f for f in filters if _is(f, JWT_TYPE, JWT_AUTHN)]  # on per route, or for all
    if not found:
        return fail(
            NAME,
            f"{where}: {names} take the tenant from a JWT of {jwt.issuer}, but no jwt_authn "
            "filter runs before ext_proc: ICE sees no identity (401 identity_required)",
            f"add jwt_authn (local: jwt_authn; Istio: RequestAuthentication; Envoy Gateway: "
            f"SecurityPolicy) before ext_proc; {HOW}",
        )
    keys = (jwt.metadata_key, jwt.issuer)
    providers = [as_dict(p) for f in found for p in as_dict(f.config.get("providers")).values()]
    mine = [p for p in providers if p.get("issuer") == jwt.issuer]
    if not mine:
        return fail(
            NAME,
            f"{where}: {names}: no jwt_authn provider has issuer {jwt.issuer}",
            f"add a provider for {jwt.issuer}; {HOW}",
        )
    if not any(p.get("payload_in_metadata") in keys for p in mine):
        got = ", ".join(sorted({str(p.get("payload_in_metadata", "")) for p in mine}))
        return fail(
            NAME,
            f"{where}: {names}: the provider of {jwt.issuer} writes its payload under "
            f"{got or 'nothing'}, ICE reads {' or '.join(keys)}",
            f"set payload_in_metadata: {jwt.metadata_key} (or identity.jwt.metadata_key)",
        )
    if JWT_NAMESPACE not in forwarded:
        return fail(
            NAME,
            f"{where}: {names}: ext_proc does not forward {JWT_NAMESPACE}: ICE never sees "
            "the verified token",
            f"add it to ext_proc's metadata_options.forwarding_namespaces.untyped; {HOW}",
        )
    return Check(
        "PASS", NAME, f"{where}: {names}: jwt_authn ({jwt.issuer}) before ext_proc, forwarded"
    )


def _mtls_check(config: dict[str, Any], spec: IdentitySpec, names: str, where: str) -> Check:
    wanted = PEER_ATTRIBUTES[0] if spec.san == "uri" else PEER_ATTRIBUTES[1]
    if wanted not in [str(a) for a in as_list(config.get("request_attributes"))]:
        return fail(
            NAME,
            f"{where}: {names} take the tenant from the client certificate, but ext_proc does "
            f"not ask for {wanted}",
            f"add {wanted} to ext_proc's request_attributes; {HOW}",
        )
    return Check(
        "MANUAL",
        NAME,
        f"{where}: {names}: ext_proc asks for {wanted}; the listener must require client "
        "certificates (local: the spec's tls; Istio: PeerAuthentication STRICT, or a MUTUAL "
        "Gateway server)",
    )


def _removed_before(hcm: HcmView, header: str, index: int) -> bool:
    removals: list[dict[str, Any]] = []
    for ext in as_list(hcm.hcm.get("early_header_mutation_extensions")):
        _, config = unwrap(as_dict(ext).get("typed_config"))
        removals += _mutation_removals(as_list(config.get("mutations")))
    for f in hcm.filters[:index]:
        if _is(f, HEADER_MUTATION_TYPE, X.HEADER_MUTATION) and not f.disabled:
            requests = as_dict(f.config.get("mutations")).get("request_mutations")
            removals += _mutation_removals(as_list(requests))
    return any(m.get("exact", "").lower() == header for m in removals)


def _header_check(
    hcm: HcmView, first_ext_proc: int, spec: IdentitySpec, names: str, where: str
) -> Check:
    authz = [
        i for i, f in enumerate(hcm.filters[:first_ext_proc]) if _is(f, EXT_AUTHZ_TYPE, EXT_AUTHZ)
    ]
    if not authz:
        return fail(
            NAME,
            f"{where}: {names} take the tenant from {spec.header}, set by an ext_authz "
            "service, but no ext_authz filter runs before ext_proc",
            f"add your ext_authz filter before ext_proc; {HOW}",
        )
    if not _removed_before(hcm, spec.header, authz[0]):
        return fail(
            NAME,
            f"{where}: {names}: a client's own {spec.header} is not removed before ext_authz: "
            "where the service does not set it, the client names its tenant",
            f"remove {spec.header} first (pieces.strip_spoofed_headers(extra=...)); {HOW}",
        )
    return Check("PASS", NAME, f"{where}: {names}: ext_authz sets {spec.header}, stripped first")


def identity_checks(
    hcm: HcmView, ex: X.Expected, ext_proc: list[tuple[int, FilterView]]
) -> list[Check]:
    """One check per identity source the judged routes use (see the module docstring)."""
    routes = [name for name in ex.judged.values() if name is not None]
    identities = route_identities(ex.policy, routes)
    if not identities or not ext_proc:
        return []
    first, flt = ext_proc[0]
    metadata = as_dict(flt.config.get("metadata_options"))
    forwarded = [
        str(n) for n in as_list(as_dict(metadata.get("forwarding_namespaces")).get("untyped"))
    ]
    by_source: dict[tuple[IdentitySource, IdentitySpec], list[str]] = {}
    for name, spec in identities.items():
        by_source.setdefault((spec.source, spec), []).append(name)
    out = []
    where = hcm.listener
    for (source, spec), named in by_source.items():
        names = "route " + ", ".join(sorted(named))
        if source == "jwt":
            out.append(_jwt_check(list(hcm.filters[:first]), forwarded, spec, names, where))
        elif source == "mtls":
            out.append(_mtls_check(flt.config, spec, names, where))
        else:
            out.append(_header_check(hcm, first, spec, names, where))
    return out
