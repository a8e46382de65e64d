"""The fused-MoE plugin's maintained benchmarks, importable as ``flyreg_moe_bench`` (each module also runs as a script)."""
