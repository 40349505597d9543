"""``ice envoy-config``: every Envoy-facing configuration ICE ships, from one source.

- ``spec``: the input (routes and their profiles, ICE's address, the backend service).
- ``pieces``: the Envoy objects ICE needs in any proxy, typed (``envoy-data-plane``).
- ``cluster_parts``: the parts of ``pieces``' clusters: endpoints, load assignments (priority
  levels for active-passive) and health checks.
- ``hcm_settings``: the connection manager's own settings: Envoy's 413 in the API's error
  format and the access log with ICE's verdict (each scoped to ICE's routes where shared).
- ``local``: the local bootstraps (``envoy/envoy.yaml``, ``envoy/bench.yaml``).
- ``istio``: EnvoyFilters for the ingress gateway and the inference pods' sidecars, matched
  as istiod matches (context, container ports), and ICE's cluster by DestinationRule.
- ``gateway``: Envoy Gateway's objects in order: the Gateway, the routes, the 404's filter.
- ``gateway_names``: what ICE and Envoy Gateway call things, and the judged routes by profile.
- ``gateway_policies``: Envoy Gateway's policies for ICE (extension, client traffic, patch).
- ``emit``: typed messages to plain data, and the files, byte-identical for the same input.

Invariant: nothing here reads the network or the clock; the same spec gives the same bytes.
"""
