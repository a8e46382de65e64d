"""Internal: tuning on Ray, one actor per GPU (the driver, the actor pool and its job stream, one actor)."""
