"""Repository-root conftest: its presence puts the root on ``sys.path`` for every test run,
so tests can import ``bench`` (not an installed package) whatever order they run in."""
