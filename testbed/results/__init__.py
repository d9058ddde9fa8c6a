"""Run folders: manifest, condition journal, per-condition Parquet tables, summaries."""
