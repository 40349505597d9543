"""The test suite: tests/<package folder>/ mirrors ext_proc/<package folder>/ (tests/README.md)."""
