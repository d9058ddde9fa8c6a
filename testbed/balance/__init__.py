"""BALANCE: hybrid autoregressive (AD) + speculative (SD) serving on one edge server.

The scheduler's problem, its approximation algorithm, an exact solver, baselines, admission
control, the cost-model profile and a discrete-event simulator. Nothing here imports torch
(only `profile.measure_cost_model` does, inside the function). The formulation and the proofs
are in docs/balance.md.
"""
