"""Benchmarks behind scripts/bench-*: they print figures and assert nothing."""
