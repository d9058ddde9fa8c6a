"""Workloads: the synthetic arithmetic task, GSM8K, and answer scoring."""
