"""The system prompt: its complexity score, and lossless compaction of the JSON in it.

- ``complexity``: ``system_prompt_complexity_score`` and ``compact_system_json``;
- ``scan``: the lossless building blocks (embedded-JSON scan, whitespace stripping,
  raw-string edits).
"""
