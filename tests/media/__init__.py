"""Tests of ``ext_proc.media``."""
