"""Internal: serving a call (the tuner's hot path and key building, binding, the build cache)."""
