"""Benchmarks: each ``bench_*.py`` module has a ``main()`` that prints a side-by-side table of
our implementation against a baseline written in this code base. ``python -m benchmarks``
(``make bench``) runs them all; ``python -m benchmarks.bench_NAME`` runs one.

Each benchmark times its code on ``wsutils.run.device.pick_device()`` (CUDA when present, else the
CPU) unless it says otherwise, and prints the device it ran on
(``wsutils.run.device.describe_device``) above its table."""
