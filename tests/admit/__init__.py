"""Tests of ``ext_proc.admit``."""
