"""hpc-batch-shepherd: the small per-job supervisor (see shepherd/main.py)."""
