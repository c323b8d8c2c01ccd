"""The MoCo dictionary: a FIFO queue of L2-normalised keys (He et al. CVPR 2020, sec. 3.1).

Design points (what the reference implementations get wrong, and what we do):

- The ring buffer ``queue`` (K, D), the write pointer ``ptr`` (a 0-d long tensor) and the
  optional ``labels`` (K,) are registered buffers, so a checkpoint carries them.
- Any batch size: row j of a batch is written at ``(ptr + j) % K`` with one ``index_copy_``;
  no ``K % batch_size == 0`` assertion. A batch larger than K keeps its newest K rows.
- No host sync: the pointer stays on the device and is never read with ``.item()``.
- No copy of the bank per step: the loss of step t uses ``queue.keys`` (the buffer itself,
  not a clone). Writing the new keys into it before ``loss.backward()`` would corrupt the
  tensor saved by autograd for the gradient of ``q @ queue.T``, which is why reference code
  clones the whole bank every step. Instead ``enqueue`` records the keys and they are written
  on the next read of ``keys`` / ``labels``, on ``flush()`` or when the
  state dict is taken, i.e. after the backward of the step that produced them. The queue seen
  by step t is exactly MoCo's: the keys of all steps before t. (If you do run a second
  forward before the first backward, PyTorch raises an in-place modification error; it
  never silently gives a wrong gradient.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.nn.distributed import gather

__all__ = ["KeyQueue"]


class KeyQueue(nn.Module):
    """FIFO queue of K keys of dimension D, optionally with an int64 label per key.

    Args:
        dim: key dimension D.
        size: number of keys K.
        store_labels: also keep a (K,) int64 ``labels`` buffer (-1 = empty slot), e.g. the
            class or dataset index of each key, for diagnostics.
        normalize: L2-normalise keys on enqueue (the initial random keys are normalised too).

    Buffers: ``queue`` (K, D) float32, ``ptr`` () int64, ``key_labels`` (K,) int64 if stored.
    """

    queue: Tensor
    ptr: Tensor
    key_labels: Tensor
    _steps: Tensor

    def __init__(self, dim: int, size: int, store_labels: bool = False,
                 normalize: bool = True) -> None:
        super().__init__()
        if dim < 1 or size < 1:
            raise ValueError(f"KeyQueue needs dim >= 1 and size >= 1, got dim={dim} size={size}")
        self.dim, self.size, self.store_labels, self.normalize = dim, size, store_labels, normalize
        self.register_buffer("queue", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        if store_labels:
            self.register_buffer("key_labels", torch.full((size,), -1, dtype=torch.long))
        # 0..K-1, to build write indices without allocating an arange per step (not saved)
        self.register_buffer("_steps", torch.arange(size), persistent=False)
        self._pending: list[tuple[Tensor, Tensor | None]] = []

    # -- reading -------------------------------------------------------------------------------
    @property
    def keys(self) -> Tensor:
        """The (K, D) bank (the buffer itself, no copy), every enqueued key written."""
        self.flush()
        return self.queue

    @property
    def labels(self) -> Tensor:
        """(K,) int64 labels of the keys (-1 for slots never written)."""
        if not self.store_labels:
            raise RuntimeError("labels: this KeyQueue was built with store_labels=False")
        self.flush()
        return self.key_labels

    def ordered_keys(self) -> Tensor:
        """The keys from oldest to newest, (K, D) (a copy; for diagnostics and tests)."""
        self.flush()
        idx = (self.ptr + torch.arange(self.size, device=self.queue.device)) % self.size
        return self.queue.index_select(0, idx)

    # -- writing -------------------------------------------------------------------------------
    @torch.no_grad()
    def enqueue(self, keys: Tensor, labels: Tensor | None = None, gathered: bool = False) -> None:
        """Add the newest keys, dropping the oldest.

        Args:
            keys: (N, D) keys of THIS process; they are gathered from all processes here
                (rank 0's rows first), unless ``gathered=True`` says they already are.
            labels: (N,) int labels, required iff ``store_labels``; gathered the same way.
            gathered: the inputs already hold the rows of all processes.
        """
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"enqueue: keys must be (N, {self.dim}), got {tuple(keys.shape)}")
        if self.store_labels != (labels is not None):
            need = "requires" if self.store_labels else "was built without"
            raise ValueError(
                f"enqueue: this queue {need} labels (store_labels={self.store_labels})"
            )
        if labels is not None and labels.shape != keys.shape[:1]:
            raise ValueError(
                f"enqueue: labels must be ({keys.shape[0]},), got {tuple(labels.shape)}"
            )
        if not gathered:
            keys = gather(keys)
            labels = gather(labels) if labels is not None else None
        keys = keys.detach().to(self.queue.dtype)
        if self.normalize:
            keys = F.normalize(keys, dim=1)
        self._pending.append((keys, labels.detach().long() if labels is not None else None))

    @torch.no_grad()
    def flush(self) -> None:
        """Write the pending keys into the ring buffer (cheap; called automatically)."""
        pending, self._pending = self._pending, []
        for keys, labels in pending:
            # row j goes to (ptr + j) % K; of a batch larger than K only the newest K survive
            n = keys.shape[0]
            skip = max(n - self.size, 0)
            idx = self._steps[: n - skip] + self.ptr
            if skip:
                idx += skip
            idx.remainder_(self.size)
            self.queue.index_copy_(0, idx, keys[skip:].to(self.queue.device))
            if labels is not None:
                self.key_labels.index_copy_(0, idx, labels[skip:].to(self.queue.device))
            self.ptr.add_(n).remainder_(self.size)

    # -- state ---------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.flush()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._pending = []
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, size={self.size}, store_labels={self.store_labels}"
