"""Tests of ``ext_proc.serve``."""
