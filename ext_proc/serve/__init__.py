"""The shell: ``ice serve``'s gRPC server and its process plumbing.

The only package that imports gRPC and Envoy's protobufs (with ``ext_proc.tools`` and the
lab). A request's way, in the order it meets these modules:

- ``server``: the grpc.aio server, its health service, workers and shutdown;
- ``collecting``: the host's collector beside the request path (in the only worker, or in a
  thread of the supervisor), the pool gauges it exports, and the metrics endpoint;
- ``servicer``: one ext_proc ``Process`` stream per HTTP request: it feeds each message to
  ``ext_proc.admit`` and sends the answer back;
- ``render``: the protobuf edge: an outcome becomes a ``ProcessingResponse``;
- ``messages``: the messages' small parts (timeout extension, subset hint, request id, the
  do-nothing answer of a phase);
- ``inforce`` and ``reload``: the policy in force, and its hot reload;
- ``helper``: the helper process that judges heavy bodies off the event loop;
- ``memtrim``: glibc's allocator settings and the trim after a flood of bodies;
- ``lease``: leader election over a Kubernetes Lease (``--leader-elect``, active-passive:
  only the leader's gRPC health is SERVING; the other replicas stand by);
- ``lease_elector``: the election itself: the Kubernetes client's loop in a thread, its
  timings, the lock's guard and the watchdog.

Invariant: nothing below this package imports it (``make check`` runs the layers contract
in pyproject.toml).
"""
