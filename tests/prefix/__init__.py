"""Tests of ``ext_proc.prefix``."""
