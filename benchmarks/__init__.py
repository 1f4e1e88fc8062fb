"""Benchmarks: each ``bench_*.py`` module has a ``main()`` that prints a side-by-side table of
our implementation against a baseline written in this code base. ``python -m benchmarks``
(``make bench``) runs them all; ``python -m benchmarks.bench_NAME`` runs one."""
