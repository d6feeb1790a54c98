"""The NVML C library stand-in (libnvidia_ml.c) and its build (build.py)."""
