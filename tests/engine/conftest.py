"""Fixtures for in-process engine runs."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_accelerate():
    """Reset accelerate's process-wide state around an in-process training run."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
