"""Tests of ``ext_proc.kv``."""
