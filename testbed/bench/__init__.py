"""Benchmarks: figures measured side by side in one run, reported as ratios."""
