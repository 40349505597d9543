"""The control planes' JWT translation, on plain Envoy config dicts: what istiod builds from a
``RequestAuthentication`` and Envoy Gateway from a ``SecurityPolicy``'s ``jwt``, for the
identity tests through the mesh-shaped proxies (tests/e2e/test_identity_mesh.py; ICE's own
patches are applied by tests/e2e/meshes.py and eg_xds.py as those control planes apply them).

Written from their sources (facts, not code):
- istiod (pilot/pkg/security/authn/policy_applier.go, ``convertToEnvoyJwtConfig``): the
  ``RequestAuthentication``s whose namespace and selector match the workload; one provider per
  ``jwtRules`` entry, named ``origins-<i>`` (issuer, audiences, ``forward`` =
  ``forwardOriginalToken``, ``payload_in_metadata`` ``payload``, the keys inline as
  ``local_jwks``: istiod fetches a ``jwksUri`` itself); one rule, prefix ``/``, requiring
  "this provider, or no token" (``requires_any`` of ``provider_name`` and ``allow_missing``;
  with several providers, the same per provider under ``requires_all``); the filter goes
  ahead of the HTTP filters an EnvoyFilter inserts before the router.
- Envoy Gateway (internal/xds/translator/jwt.go): per xDS route of the targeted HTTPRoute, a
  provider ``<route name>/<provider name>`` (issuer, audiences, ``payload_in_metadata`` = the
  issuer, keys from ``localJWKS``'s inline text), ``requirement_map[<route name>]`` = the
  providers, or any of them and ``allow_missing`` with ``optional: true``; each route names its
  requirement (``PerRouteConfig.requirement_name``); the filter sits before the ext_proc
  filters.
"""

from __future__ import annotations

from typing import Any

JWT_AUTHN = "envoy.filters.http.jwt_authn"
TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3."


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    listener = bootstrap["static_resources"]["listeners"][0]
    chain = listener.get("default_filter_chain") or listener["filter_chains"][0]
    hcm: dict[str, Any] = chain["filters"][0]["typed_config"]
    return hcm


def _inline(text: str) -> dict[str, Any]:
    return {"inline_string": text}


def istio_jwt(
    bootstrap: dict[str, Any],
    objects: list[dict[str, Any]],
    namespace: str,
    labels: dict[str, str],
    jwks_of: dict[str, str],
) -> None:
    """istiod's jwt_authn for the workload (``namespace``, ``labels``), first in the chain.
    ``jwks_of``: issuer → keys, what istiod fetches for a ``jwksUri``."""
    rules = [
        rule
        for o in objects
        if o["kind"] == "RequestAuthentication"
        and o["metadata"]["namespace"] == namespace
        and all(labels.get(k) == v for k, v in o["spec"]["selector"]["matchLabels"].items())
        for rule in o["spec"]["jwtRules"]
    ]
    assert rules, f"no RequestAuthentication selects {namespace}/{labels}"
    providers = {}
    for i, rule in enumerate(rules):
        keys = rule.get("jwks") or jwks_of[rule["issuer"]]
        providers[f"origins-{i}"] = {
            "issuer": rule["issuer"],
            "audiences": rule.get("audiences", []),
            "forward": rule.get("forwardOriginalToken", False),
            "payload_in_metadata": "payload",
            "local_jwks": _inline(keys),
        }
    per_provider = [
        {"requires_any": {"requirements": [{"provider_name": name}, {"allow_missing": {}}]}}
        for name in providers
    ]
    requires = (
        per_provider[0]
        if len(per_provider) == 1
        else {"requires_all": {"requirements": per_provider}}
    )
    config = {
        "@type": f"{TYPE}JwtAuthentication",
        "providers": providers,
        "rules": [{"match": {"prefix": "/"}, "requires": requires}],
        "bypass_cors_preflight": True,
    }
    _hcm(bootstrap)["http_filters"].insert(0, {"name": JWT_AUTHN, "typed_config": config})


def eg_jwt(bootstrap: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """Envoy Gateway's jwt_authn for the SecurityPolicies in ``docs``, before ext_proc."""
    hcm = _hcm(bootstrap)
    routes = [r for vh in hcm["route_config"]["virtual_hosts"] for r in vh["routes"]]
    providers: dict[str, Any] = {}
    requirements: dict[str, Any] = {}
    for policy in (d for d in docs if d["kind"] == "SecurityPolicy"):
        ns, jwt = policy["metadata"]["namespace"], policy["spec"]["jwt"]
        for target in policy["spec"]["targetRefs"]:
            prefix = f"httproute/{ns}/{target['name']}/rule/"
            for route in (r for r in routes if r["name"].startswith(prefix)):
                reqs: list[dict[str, Any]] = []
                for p in jwt["providers"]:
                    key = f"{route['name']}/{p['name']}"
                    providers[key] = {
                        "issuer": p["issuer"],
                        "audiences": p.get("audiences", []),
                        "payload_in_metadata": p["issuer"],
                        "forward": True,
                        "local_jwks": _inline(p["localJWKS"]["inline"]),
                    }
                    reqs.append({"provider_name": key})
                if jwt.get("optional"):
                    reqs.append({"allow_missing": {}})
                requirements[route["name"]] = (
                    reqs[0] if len(reqs) == 1 else {"requires_any": {"requirements": reqs}}
                )
                route.setdefault("typed_per_filter_config", {})[JWT_AUTHN] = {
                    "@type": f"{TYPE}PerRouteConfig",
                    "requirement_name": route["name"],
                }
    assert providers, "no SecurityPolicy targets an HTTPRoute of the bootstrap"
    config = {
        "@type": f"{TYPE}JwtAuthentication",
        "providers": providers,
        "requirement_map": requirements,
    }
    filters = hcm["http_filters"]
    first = next(i for i, f in enumerate(filters) if "ext_proc" in f["name"])
    filters.insert(first, {"name": JWT_AUTHN, "typed_config": config})
