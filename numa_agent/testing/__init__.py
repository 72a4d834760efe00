"""Helpers for tests, benchmarks and conformance runs: synthetic machines, the
kubelet's literal merge, the kubelet vector runner. Not used by the agent."""
