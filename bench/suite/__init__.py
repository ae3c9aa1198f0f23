"""The benchmark suite behind bench/run.py (one module per section)."""
