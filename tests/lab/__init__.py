"""Tests of ``ext_proc.lab``."""
