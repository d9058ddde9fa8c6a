"""Typed records (`records`), one stats object per condition (`stats`), SLOs and cost tables.

Every metric of the testbed is defined here, or in `agents.spec.rates` for the two rates the
agents also need (re-exported below); nothing else defines one.
"""

from agents.spec.rates import acceptance_rate, mean_accepted_length

__all__ = ["acceptance_rate", "mean_accepted_length"]
