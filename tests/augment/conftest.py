"""One torch thread per test: on a shared, busy 2-core machine, two-thread elementwise ops wait
for a descheduled peer thread (milliseconds per op). Restored after each test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
