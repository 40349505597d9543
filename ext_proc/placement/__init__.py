"""Placement: where in its pool a request is judged (and sent), and the in-flight ledgers.

- ``endpoints``: endpoint names, the prefix-affinity key, the picker protocol's header;
- ``placer``: which endpoint a request is judged against (``endpoint_pick``);
- ``poolview``: what a pool's snapshot says for a profile, and the worker's KV holds;
- ``ledger_shm``: the workers' shared in-flight ledger on one host (``--workers N``);
- ``ledger_redis`` and ``ledger_scripts``: the replicas' shared ledger in Redis (``--ledger``).

Invariant: placement reads snapshots and policy types; it never imports ``ext_proc.admit``.
"""
