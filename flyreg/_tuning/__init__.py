"""Internal: the tuning run behind ``flyreg tune`` and ``check --remeasure`` (jobs planned, run, shown)."""
