"""Validated configuration: experiment playbooks (and the loaders that name bad keys)."""
