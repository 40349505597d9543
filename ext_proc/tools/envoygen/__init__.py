"""``ice envoy-config``: every Envoy-facing configuration ICE ships, from one source.

- ``spec``: the input (routes and their profiles, ICE's address, the backend service).
- ``pieces``: the Envoy objects ICE needs in any proxy, typed (``envoy-data-plane``).
- ``local``: the local bootstraps (``envoy/envoy.yaml``, ``envoy/bench.yaml``).
- ``istio``: EnvoyFilters for the ingress gateway and the inference pods' sidecars.
- ``gateway``: Envoy Gateway's routes and policies.
- ``emit``: typed messages to plain data, and the files, byte-identical for the same input.

Invariant: nothing here reads the network or the clock; the same spec gives the same bytes.
"""
