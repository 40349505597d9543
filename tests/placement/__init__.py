"""Tests of ``ext_proc.placement``."""
