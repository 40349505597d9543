"""Tests of ``ext_proc.truncate``."""
