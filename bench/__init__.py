"""Benchmarks: the speed figures (``speed``), the paper's workload (``workload``), the
stale-read checker (``checker``) and the crash demo (``demo``)."""
