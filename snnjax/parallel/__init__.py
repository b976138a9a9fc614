"""Parallelism on one mesh with axes data / fsdp / tensor / stage."""
