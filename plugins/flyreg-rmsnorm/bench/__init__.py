"""The RMSNorm plugin's maintained benchmarks, importable as ``flyreg_rmsnorm_bench`` (each module also runs as a script)."""
