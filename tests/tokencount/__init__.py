"""Tests of ``ext_proc.tokencount``."""
