"""Internal: ``flyreg report``'s page of what tuning found (its data, plots and HTML) and its one-screen summary."""
