"""numa-agent: NUMA-aligned, exclusive CPUs, memory and devices for latency-sensitive programs."""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)
