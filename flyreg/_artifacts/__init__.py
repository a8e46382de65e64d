"""Internal: stored configs (artifact names and store, the scratch cache, validation)."""
