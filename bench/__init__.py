"""Benchmarks: medians and ratios against baselines measured in the same run (docs/benchmarks.md)."""
