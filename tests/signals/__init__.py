"""Tests of ``ext_proc.signals``."""
