"""Suite-wide fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Put structlog's and the root logger's configuration back after each test.

    The CLI's settings path (``daemon.log.configure_logging``) binds both to the stream
    ``sys.stdout`` is *at that moment* — pytest's capture of that one test, closed right
    after it — so a later test that logs failed with "I/O operation on closed file".
    """
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)
