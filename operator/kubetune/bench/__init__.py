"""Benchmarks and quality checks of the pure core, runnable as modules:
``python -m kubetune.bench.core_bench`` and ``python -m kubetune.bench.quality``."""
