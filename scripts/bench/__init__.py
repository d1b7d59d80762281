"""Benchmarks and exactness checks, each run as ``python -m scripts.bench.<name>``: they print ratios against a
baseline measured in the same run (never timed assertions in tests)."""
