"""Collective microbenchmarks at the plan's message sizes (see runner.py, fit.py)."""
