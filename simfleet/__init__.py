"""coeffd: simfleet."""
