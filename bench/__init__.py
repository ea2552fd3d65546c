"""Benchmarks: each prints figures as ratios against the naive way, side by side."""
