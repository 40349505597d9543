"""Tests of ``ext_proc.sysprompt``."""
