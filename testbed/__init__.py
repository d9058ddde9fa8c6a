"""Controller of the edge speculative-inference testbed: CLI, lab, impairment, runs, reports."""

__version__ = "0.1.0"
