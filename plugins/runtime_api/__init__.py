"""runtime_api: CUDA runtime and driver API calls per iteration (being built)."""
