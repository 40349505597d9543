"""Tests of ``ext_proc.tools``."""
