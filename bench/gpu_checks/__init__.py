"""The checks `bench/gpu_check.py` runs, one module per group; `shared` holds what they share."""
