"""Building blocks of the methods: encoders, heads, momentum encoders, the key queue, BN
variants and cross-process helpers. Each is usable on its own.

- Encoders: :func:`create_encoder`, :func:`list_encoders`, :func:`register_encoder`,
  :func:`stage_features` (intermediate maps, for distillation),
  :func:`split_classifier` (a classification model -> encoder and classifier).
- Heads: :func:`build_mlp`, :func:`build_head`.
- Momentum: :func:`momentum_update` (foreach EMA), :class:`MomentumEncoder`,
  :func:`constant_momentum`, :func:`cosine_momentum`, :func:`linear_momentum`.
- Queue: :class:`KeyQueue`.
- Normalisation: :class:`SplitBatchNorm2d`, :func:`convert_to_split_bn`, :func:`convert_to_sync_bn`.
- ``contrastive.nn.distributed``: ``gather``, ``gather_with_grad``, ``batch_shuffle``,
  ``batch_unshuffle``, ``world_size``, ``rank``.

Importing this package does not import torchvision or timm; they load when an encoder that
needs them is built.
"""

from contrastive.nn import distributed
from contrastive.nn.encoders import (
    EncoderArgumentError,
    UnknownEncoderError,
    create_encoder,
    list_encoders,
    register_encoder,
    resolve_encoder,
    split_classifier,
    stage_features,
)
from contrastive.nn.heads import HEAD_KINDS, build_head, build_mlp
from contrastive.nn.momentum import (
    MomentumEncoder,
    constant_momentum,
    copy_buffers,
    cosine_momentum,
    linear_momentum,
    momentum_update,
)
from contrastive.nn.norm import SplitBatchNorm2d, convert_to_split_bn, convert_to_sync_bn
from contrastive.nn.queue import KeyQueue

__all__ = [
    "EncoderArgumentError",
    "HEAD_KINDS",
    "KeyQueue",
    "MomentumEncoder",
    "SplitBatchNorm2d",
    "UnknownEncoderError",
    "build_head",
    "build_mlp",
    "constant_momentum",
    "convert_to_split_bn",
    "convert_to_sync_bn",
    "copy_buffers",
    "cosine_momentum",
    "linear_momentum",
    "create_encoder",
    "distributed",
    "list_encoders",
    "momentum_update",
    "register_encoder",
    "resolve_encoder",
    "split_classifier",
    "stage_features",
]
