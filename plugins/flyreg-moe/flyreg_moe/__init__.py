"""Fused mixture-of-experts kernels for flyreg."""
