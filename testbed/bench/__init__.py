"""Benchmarks: figures measured side by side in one run, reported as ratios.

Where a benchmark lives (one rule): its measuring code is a module `testbed/bench/<area>.py`
(sd, verify, gpu, link, ...) and it runs as `testbed bench <area>`, registered in
`testbed/commands/bench.py`; figures kept for the README go in `testbed/bench/results/`.
Benchmarks are never timed tests: a speed goal is a printed ratio, measured here.
"""
