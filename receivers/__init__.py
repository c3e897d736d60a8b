"""coeffd: receivers."""
