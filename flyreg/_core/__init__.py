"""Internal: the vocabulary every layer shares (configs, keys and device identity, results, file I/O)."""
