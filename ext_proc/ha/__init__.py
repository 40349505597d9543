"""High availability without shared state: one ICE replica judges, the others stand by.

- Plain Envoy: ICE's cluster in priority levels (``ext_proc.envoygen.pieces.ice_cluster``
  with ``standby=True``); Envoy's health checks pick the replica, ICE itself does nothing.
- Kubernetes: ``lease``, leader election over a ``coordination.k8s.io`` Lease
  (``ice serve --leader-elect``); only the leader's gRPC health is SERVING, so only it is in
  the Service's endpoints (the readiness probe) and in Envoy's healthy hosts.

Invariant: nothing here is imported on the serve path unless ``--leader-elect`` is given, and
the ``kubernetes`` package (the ``k8s`` extra) only when the election starts.
"""
