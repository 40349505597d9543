"""Tests of ``ext_proc.policy``."""
