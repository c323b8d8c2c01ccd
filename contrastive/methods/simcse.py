"""SimCSE: contrastive sentence embeddings, unsupervised (dropout noise) and supervised (NLI).

Gao, Yao, Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings", EMNLP 2021,
arXiv:2104.08821; the authors' code is princeton-nlp/SimCSE (``simcse/models.py``: ``cl_init``,
``cl_forward``, ``sentemb_forward``; ``train.py`` defaults; README "Hyperparameters").

One step, for B examples of S sentences (``input_ids`` (B, S, T))::

    h = pool(encoder(all B*S sentences))            # [CLS] of the last layer, or masked mean
    z = unit(mlp(h))  reshaped (B, S, D)            # mlp = dense + tanh on [CLS] ("cls" pooling)
    z1, z2, z3 = z[:, 0], z[:, 1], z[:, 2]          # anchor, positive, hard negative (S = 3)
    keys = [gather_with_grad(z2); gather_with_grad(z3)]   # (M or 2M, D), M = B * world size
    loss = infonce(z1, keys, positive_offset=B * rank, temperature=0.05)

- Unsupervised (paper sec. 3, eq. 4): S = 1, each sentence is encoded twice in one batch (the
  official ``train.py`` repeats the sentence; rows get independent dropout masks, p = 0.1 of
  BERT); the two passes are the positive pair, the other sentences the negatives.
- Supervised (sec. 4, eq. 5): S = 3 (premise, entailment, contradiction): the entailment is
  the positive; every entailment and every contradiction of the (global) batch are the
  candidates, so each anchor's own contradiction is a hard negative. S = 2 is supervised pairs
  without hard negatives. As the official code, S is read from the batch.
- Similarity: cosine / temperature, tau = 0.05 for both (``train.py`` ``temp`` default 0.05;
  paper sec. 3 and App. A); the loss is the registry's ``infonce`` (query z1, in-batch keys).
- Pooling (``train.py`` ``pooler_type`` default ``"cls"``; paper sec. 6.3 / Table 6 and App. A):
  ``"cls"``: [CLS] of the last layer with an MLP (Linear(H, H) + tanh, freshly initialised,
  the encoder's own pooler is removed as ``BertForCL`` builds ``BertModel(add_pooling_layer=
  False)``); ``mlp_only_train=True`` (unsupervised SimCSE, README: "train the model with MLP
  layer but test the model without it") drops the MLP at test, supervised SimCSE keeps it.
  ``"cls_before_pooler"``: [CLS] without MLP; ``"avg"``: masked mean of the last layer.
- Several processes: the keys are gathered WITH gradient and each process scores its own B
  queries; with DDP's gradient averaging the update equals one process with the whole batch.
  (The official code gathers without gradient, puts its local rows back, and computes the
  full-batch loss on every process; its gradient is the same up to a 1 / world-size factor.)
  Trained by the engine (``recipes/simcse.py``, :class:`contrastive.engine.TextAdapter`);
  tests/text/test_simcse_recipe.py checks 2 processes against 1 through that recipe in float64.

Not included: ``hard_negative_weight`` (the official default 0, i.e. weight 1, is what we do)
and the MLM auxiliary objective (``do_mlm``, off by default in the official code).

Evaluation embeddings: :meth:`SimCSE.embed` (eval mode), or :meth:`SimCSE.sentence_encoder`,
a plain :class:`~contrastive.nn.text_encoders.TextEncoder` whose pooled output is the embedding
(the MLP becomes the model's pooler, as the authors' ``simcse_to_huggingface.py``), so
``save_pretrained`` gives a folder any BERT user can load.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import in_batch_metrics, unit
from contrastive.methods.base import Method, read
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["POOLERS", "SimCSE"]

POOLERS = ("cls", "cls_before_pooler", "avg")
_NAME = "SimCSE"


@register_method("simcse")
class SimCSE(Method):
    """SimCSE on a text encoder (see the module docstring for the step and the paper).

    Args:
        encoder: a :class:`~contrastive.nn.text_encoders.TextEncoder` or an encoder name
            (``"bert"`` with ``encoder_kwargs`` sizes, ``"hf:FOLDER"``); ``self.encoder``.
        pooling: one of :data:`POOLERS` (official ``pooler_type``; default ``"cls"``).
        mlp_only_train: use the MLP in training only (unsupervised SimCSE); with ``"cls"`` only.
        temperature: tau of the cosine similarities (0.05).
        loss: registry name called as ``loss(z1, keys, positive_offset=...)`` (``"infonce"``).
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)`` reads ``input_ids`` and ``attention_mask`` ((B, S, T), or (B, T) for
    S = 1) and ``token_type_ids`` when present; no schedule.
    """

    needs = ("input_ids", "attention_mask")
    uses_in_batch_negatives = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # official: train.py --pooler_type cls --mlp_only_train --temp 0.05 (BERT: batch 64, lr 3e-5)
        "unsup": dict(pooling="cls", mlp_only_train=True, temperature=0.05),
        # official: --pooler_type cls --temp 0.05, MLP kept at test (batch 512, lr 5e-5, 3 epochs)
        "sup": dict(pooling="cls", mlp_only_train=False, temperature=0.05),
    }

    def __init__(
        self,
        encoder: str | nn.Module = "bert",
        pooling: str = "cls",
        mlp_only_train: bool = False,
        temperature: float = 0.05,
        loss: str = "infonce",
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLERS:
            raise ValueError(f"SimCSE: pooling must be one of {POOLERS}, got {pooling!r}")
        if mlp_only_train and pooling != "cls":
            raise ValueError(f"SimCSE: mlp_only_train needs pooling='cls' (the MLP sits on "
                             f"[CLS]); got pooling={pooling!r}")
        if not temperature > 0:
            raise ValueError(f"SimCSE: temperature must be > 0, got {temperature!r}")
        enc: Any = resolve_encoder(encoder, **(encoder_kwargs or {}))
        if not callable(getattr(enc, "encode", None)) or not hasattr(enc, "model"):
            raise TypeError(f"SimCSE needs a text encoder (contrastive.text.TextEncoder, e.g. "
                            f"'bert' or 'hf:FOLDER'), got {type(enc).__name__}")
        if getattr(enc.model, "pooler", None) is not None:
            enc.model.pooler = None  # as BertModel(add_pooling_layer=False) in BertForCL
        enc.pooling = "mean" if pooling == "avg" else "cls"
        self.encoder = enc
        self.pooling = pooling
        self.mlp_only_train = mlp_only_train
        self.temperature = temperature
        h = int(enc.num_features)
        self.mlp: nn.Sequential | None = None
        if pooling == "cls":
            dense = nn.Linear(h, h)
            std = float(getattr(enc.model.config, "initializer_range", 0.02))
            nn.init.normal_(dense.weight, std=std)  # as HF's _init_weights for Linear
            nn.init.zeros_(dense.bias)
            self.mlp = nn.Sequential(dense, nn.Tanh())
        self.criterion = get_loss(loss, temperature=temperature, normalize=False)

    # -- embeddings ------------------------------------------------------------------------------
    def _pooled(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None, use_mlp: bool) -> Tensor:
        encoder: Any = self.encoder
        # [CLS] or masked mean (set in __init__): encoder(...) is encode(...).pooled, called
        # as the backbone itself so that the engine can cache it (--grad-cache-chunk)
        h = encoder(input_ids, attention_mask, token_type_ids)
        if use_mlp and self.mlp is not None:
            h = self.mlp(h)
        return h

    @property
    def mlp_at_test(self) -> bool:
        """Whether evaluation embeddings go through the MLP (supervised "cls")."""
        return self.mlp is not None and not self.mlp_only_train

    def embed(self, input_ids: Tensor, attention_mask: Tensor,
              token_type_ids: Tensor | None = None) -> Tensor:
        """Sentence embeddings (N, H) as the paper evaluates them (official ``sentemb_forward``);
        call in eval mode (no dropout). Not normalised: cosine similarity is taken by the user."""
        return self._pooled(input_ids, attention_mask, token_type_ids, self.mlp_at_test)

    def sentence_encoder(self) -> Any:
        """A copy of the encoder whose pooled output is :meth:`embed`'s (for export / STS).

        With the MLP kept at test, it becomes the model's pooler (dense + tanh on [CLS], the
        structure of BERT's pooler, as ``simcse_to_huggingface.py``) and ``pooling="pooler"``.
        """
        enc: Any = copy.deepcopy(self.encoder)
        if self.mlp is not None and not self.mlp_only_train:
            from transformers.models.bert.modeling_bert import BertPooler

            dense: Any = self.mlp[0]
            pooler = BertPooler(enc.model.config).to(device=dense.weight.device,
                                                     dtype=dense.weight.dtype)
            pooler.dense.load_state_dict(dense.state_dict())
            enc.model.pooler = pooler
            enc.pooling = "pooler"
        return enc

    # -- training step ---------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        ids = read(batch, "input_ids", _NAME)
        mask = read(batch, "attention_mask", _NAME)
        types = batch.get("token_type_ids")
        ids, mask, types = _grouped(ids, mask, types)
        b, s, t = ids.shape
        if s == 1:  # unsupervised: the same sentence twice, independent dropout masks
            ids, mask = ids.repeat(1, 2, 1), mask.repeat(1, 2, 1)
            types = None if types is None else types.repeat(1, 2, 1)
            s = 2
        h = self._pooled(ids.reshape(b * s, t), mask.reshape(b * s, t),
                         None if types is None else types.reshape(b * s, t), use_mlp=True)
        z = unit(h).view(b, s, -1)
        z1, others = z[:, 0], [z[:, j] for j in range(1, s)]  # positive, [hard negative]
        offset = 0
        if world_size() > 1:
            others = [gather_with_grad(x) for x in others]
            offset = b * rank()
        keys = torch.cat(others)  # (M, D) or (2M, D): positives first
        loss = self.criterion(z1, keys, positive_offset=offset)
        pos_col = torch.arange(b, device=z1.device) + offset
        metrics = in_batch_metrics(z1.detach(), keys.detach(), pos_col=pos_col)
        return {"loss": loss, **metrics, "embeddings": z1.detach()}


def _grouped(ids: Any, mask: Any, types: Any) -> tuple[Tensor, Tensor, Tensor | None]:
    """Check the token tensors and bring them to (B, S, T)."""
    if not isinstance(ids, Tensor) or ids.dim() not in (2, 3) or ids.is_floating_point():
        got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{_NAME}: batch['input_ids'] must be int token ids (B, S, T) or "
                         f"(B, T), got {got}; build batches with contrastive.data.text_batches."
                         "GroupCollate")
    if ids.dim() == 2:
        ids = ids[:, None]
    for name, x in (("attention_mask", mask), ("token_type_ids", types)):
        if x is not None and (not isinstance(x, Tensor) or x.numel() != ids.numel()):
            raise ValueError(f"{_NAME}: batch[{name!r}] must have the shape of input_ids "
                             f"{tuple(ids.shape)}, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if not 1 <= ids.shape[1] <= 3:
        raise ValueError(f"{_NAME}: {ids.shape[1]} sentences per example; SimCSE takes 1 "
                         "(unsupervised), 2 (anchor, positive) or 3 (anchor, positive, hard "
                         "negative)")
    return ids, mask.view(ids.shape), None if types is None else types.view(ids.shape)
