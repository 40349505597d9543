"""Write envoy-gateway.json: the openAPIV3Schema of Envoy Gateway's CRDs that ICE's manifests use.

No package registry ships Envoy Gateway's CRDs, so their schemas are kept here, taken from the
release's Helm chart (charts/gateway-helm/charts/crds/crds/generated/ in envoyproxy/gateway):

    python tests/k8s/crds/extract.py v1.9.0 39763b1c07ec30a5526fe70434a2cfe4181de642 \
        gateway.envoyproxy.io_{backends,backendtrafficpolicies,clienttrafficpolicies}.yaml \
        gateway.envoyproxy.io_{envoyextensionpolicies,envoypatchpolicies,httproutefilters}.yaml

(EnvoyProxy and SecurityPolicy are left out: 1.9 MB of schema for kinds ICE does not use.)

Descriptions are dropped (they are most of the bytes); every other keyword is kept as the CRD
has it. tests/k8s/validate.mjs validates with these schemas.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def strip(schema: Any) -> Any:
    """The schema without its ``description``s (never touching property names)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description" and isinstance(value, str):
            continue
        if key == "properties":
            out[key] = {name: strip(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = strip(value)
        elif key in SCHEMA_LISTS:
            out[key] = [strip(sub) for sub in value]
        else:
            out[key] = value
    return out


def main(argv: list[str]) -> None:
    tag, commit, *files = argv
    schemas: dict[str, Any] = {}
    for name in files:
        crd = yaml.safe_load(Path(name).read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                key = f"{group}/{version['name']}/{kind}"
                schemas[key] = strip(version["schema"]["openAPIV3Schema"])
    out = {
        "_source": f"github.com/envoyproxy/gateway {tag} ({commit}), "
        "charts/gateway-helm/charts/crds/crds/generated/; Apache-2.0",
        "schemas": schemas,
    }
    target = Path(__file__).with_name("envoy-gateway.json")
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
