"""``import contrastive.losses`` must stay torch-only (the losses are reused in other projects)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torchvision", "timm", "accelerate", "faiss", "PIL")

# Blocking the heavy packages as if they were not installed (pip install --no-deps + torch).
BLOCK = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError(f"{{name}} is blocked by the test")
        return None
sys.meta_path.insert(0, Block())
"""

CODE = f"""
import sys
import torch
import contrastive
import contrastive.losses as L
loss = L.get_loss("ntxent")(torch.randn(4, 8), torch.randn(4, 8))
loss = L.functional.infonce(torch.randn(4, 8), torch.randn(4, 8), torch.randn(16, 8))
assert contrastive.get_loss is L.get_loss
loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
assert not loaded, f"import contrastive.losses pulled in {{loaded}}"
print("ok", L.list_losses())
"""


def test_import_contrastive_losses_imports_torch_only():
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout and "infonce" in result.stdout


def test_losses_work_when_only_torch_is_installed():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK + CODE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
