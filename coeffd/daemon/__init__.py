"""coeffd: daemon."""
