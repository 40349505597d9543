"""``ice doctor``: a running deployment checked against the production checklist, from outside.

Modules, one job each:

- ``cli``: arguments, the order of the parts, output and exit status (``main``);
- ``model``: the ``Check`` record and its text / JSON renderings;
- ``fetch``: the only HTTP client (GET → text, or ``FetchError`` with the reason);
- ``expect``: what ICE needs from Envoy (from ``ext_proc.tools.envoygen.pieces``) and this
  deployment's judged, read-only and passthrough paths and policy;
- ``dump``: Envoy's ``/config_dump`` or a bootstrap → HCMs, route tables, clusters;
- ``routing``: which route a request takes and whether ext_proc runs on it;
- ``envoy_filters`` (ext_proc's place and settings), ``envoy_guards`` (header stripping,
  path normalisation, body limit), ``envoy_routes`` (what each kind of path meets),
  ``envoy_cluster`` (ICE's cluster): the checks of one inference HCM; ``envoy_mesh``: the
  mesh's traps (the proxy's Envoy / Istio version, Istio patches not in force, ICE's cluster
  left out of the proxy); ``envoy``: the Envoy part (admin interface → those checks, and
  ICE's hosts as Envoy sees them);
- ``ice``: ICE's gRPC health and its metrics (pool freshness, scrape errors, policy);
- ``backend``: each backend's ``/metrics``, ``/v1/models`` and ``/version``;
- ``manual``: the checklist items that cannot be checked from outside.

Invariant: the checks are pure functions of what was read (tests hand them recorded
pages); only ``fetch`` and ``ice.health_checks`` do I/O.
"""

from __future__ import annotations

from ext_proc.tools.doctor.cli import main

__all__ = ["main"]
