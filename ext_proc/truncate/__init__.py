"""Semantic history truncation: drop the turns least related to the current question.

Modules, in the request's order:
- ``units``: a chat body (OpenAI or Anthropic) as turns that stay or go together, with the
  texts to embed and their token estimates (pure);
- ``planner``: which turns to keep within a token budget, given similarities or none
  (recency), and the edited body (pure; kept messages are copied byte for byte);
- ``runner``: asks the embedding worker for similarities under a deadline and falls back to
  recency when it is late or down (the only part that waits);
- ``embed`` / ``worker`` / ``client`` / ``process`` / ``host``: the sentence-transformers
  model, the one embedding worker process per host, the stdlib-only client the ext_proc
  workers use, the worker's process handle, and how ``ice serve`` runs it;
- ``lexical``: term overlap blended into the similarity; ``cli``: ``ice truncate``.

Invariant: nothing here imports torch except ``embed`` (and ``worker``, which uses it), so
the ext_proc workers stay small; this package is imported only when a profile enables
truncation or ``ice truncate`` runs.
"""
