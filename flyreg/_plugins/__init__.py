"""Internal: the op contract (hook specs, the typed facade over one op's hooks) and entry-point discovery."""
