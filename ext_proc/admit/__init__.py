"""Admission: a request's way through ICE without I/O, from its headers to its outcome.

- ``routing``: the route's gRPC metadata → the route's binding in the policy;
- ``pipeline``: headers → body → verdict, for one policy (the core of the request's way);
- ``verdict``: what a body phase concludes (decision, features, outcome, placement);
- ``outcome``: a decision as what Envoy must do (continue with edits, or answer now);
- ``faults``: ICE's own faults while judging a body, by stage (``JudgeFault``);
- ``recorder``: a verdict's metrics and its blocks held in the in-flight ledger;
- ``reload_carry``: what a pipeline built after a policy reload takes over;
- ``counting``: when a prompt is counted exactly (only when the verdict could depend on it);
- ``backlog``: the worker's body backlog, and when the coarse verdict (``ext_proc.policy.coarse``:
  from the headers or the size, when the body cannot be read in time) is used;
- ``truncation``: finishing a history truncation (the embedding worker's answer → a verdict);
- ``queue``: the admission queue, where a request shed for memory waits for room;
- ``shared_ledger``: admission against the replicas' shared ledger (``--ledger``);
- ``overload_answer``: a backend's own overload 503, answered as ICE's.

Invariant: no gRPC, protobuf or network I/O here; the shell (``ext_proc.serve``) calls in.
"""
