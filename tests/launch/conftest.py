"""Fixtures of the launchers' tests: the recipe helpers and a free port for the slow runs."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def rx():
    """The recipe helpers of tests/recipes/conftest.py (tests import nothing from a conftest
    under --import-mode=importlib)."""
    spec = importlib.util.spec_from_file_location(
        "_recipe_helpers", Path(__file__).resolve().parents[1] / "recipes" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a run's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
