"""Benchmarks that print tables and append JSONL records (run as ``python -m snnjax.bench.<name>``)."""
