"""Prefect flows: when and where benchmarks run. Thin: every decision lives in replaybench."""
