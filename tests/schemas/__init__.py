"""Tests of ``ext_proc.schemas``."""
