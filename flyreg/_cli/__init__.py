"""Internal: the ``flyreg`` command line."""
