"""What only the command line uses: none of it runs on the request path.

- ``dryrun``: ``ice evaluate``, one request judged offline with the server's pipeline;
- ``doctor``: ``ice doctor``, a running deployment checked from outside;
- ``envoygen``: ``ice envoy-config``, every Envoy-facing configuration ICE ships;
- ``calibrate``: ``ice calibrate``, pressure weights learned from a pool's outcomes;
- ``protogen``: ``make protos``, the policy schema compiled into ``ext_proc/_pb``.
"""
