"""Fixtures shared by the chart tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_helpers import wrapper_chart


@pytest.fixture(scope="module")
def wrapper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chart that embeds coeffd's sidecar templates in a vLLM Deployment (sidecar mode)."""
    return wrapper_chart(tmp_path_factory.mktemp("wrapper"))
