"""Shared fixtures: paths, the shared data folder, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder beside the project; skip when a user has only the project."""
    if not (SHARED_DATA / "cifar10-jpeg.tar").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (only needed for integration tests)")
    return SHARED_DATA
