"""coeffd: learners."""
