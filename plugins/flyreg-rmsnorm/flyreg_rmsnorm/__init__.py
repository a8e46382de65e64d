"""In-tree RMSNorm kernels for flyreg."""
