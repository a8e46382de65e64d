"""Internal: searching a spec's configs (the engine, timing, the correctness gate)."""
