"""Suite-wide fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test first, each file's tests kept together and in order.

    ``make test`` hands whole files to two workers (``--dist loadfile``), each taking the
    next file in collection order when it is free; a one-minute file collected late ran
    alone at the end while the other worker idled. Longest first bounds that tail by the
    shortest files instead. (xdist keeps this order only with ``--no-loadscope-reorder``,
    which the Makefile passes; by default it sorts files by their number of tests.)"""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable


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
