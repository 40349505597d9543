"""The lab: what runs ICE for a person or a test, never what serves a request.

- ``stack``: start Envoy + ICE + a backend as subprocesses on free ports (tests, benches, demo).
- ``devbackend``: the stdlib OpenAI/Anthropic/vLLM-shaped backend whose memory state is set by
  hand.
- ``vllm_local``: install the CPU build of vLLM in its own venv, build the tiny model, serve it.
- ``overload``: the overload burst against a real vLLM, with and without ICE.
- ``demo``: ``ice demo``'s walkthrough.

Invariant (``.importlinter``, checked by ``make test``): nothing outside this package imports
it, except ``ext_proc.cli`` for its lab commands (``demo``, ``dev-backend``). The container
image leaves it out (``.dockerignore``).
"""
