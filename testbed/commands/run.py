"""placeholder: run commands (being written)."""
