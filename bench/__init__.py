"""Benchmarks: issue 3's speed figures (``speed``) and the paper's workload (``workload``)."""
