"""Benchmarks: dataref against a seed-style baseline and the naive rows pattern.

``make bench`` (``python -m tests.benchmarks``) runs them and writes BENCHMARKS.md. Not part
of ``make test``: pytest skips this directory (``norecursedirs``).
"""
