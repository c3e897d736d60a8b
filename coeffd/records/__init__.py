"""coeffd: the records every room shares — what receivers emit and what learners learn from.

The bottom room: it imports nothing of coeffd's, and every other room may import it.
"""
