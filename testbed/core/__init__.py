"""The ground floor: errors and exit codes, well-known paths, reading YAML into validated
models, crash-safe files, statistics. Imports nothing else of the testbed."""
