"""CLIP through the training engine: an image-text data set's per-sample fields (token ids)
reach the method with the right sample, the logit scale stays clamped, and a method that needs
fields the data set lacks fails before training."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from contrastive.data import get_dataset
from contrastive.engine import ImageConfig, train
from contrastive.engine.extras import split_item
from contrastive.engine.loader import SeededDataset
from contrastive.methods import CLIP

pytest.importorskip("transformers")

DATA = "shapes-captions:n=48,n_test=20,size=16,max_length=12"


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = DATA
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 1
    max_steps: int = 2
    optimizer: str = "adamw"
    lr: float = 1e-3
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 0
    save_every_epochs: int = 0
    knn_every: int = 1
    knn_k: int = 5
    log_every: int = 1
    batched_augment: str = "off"


class _OneView:
    """One view, scaled to [0, 1] (CLIP on shapes uses no augmentation)."""

    mean = (0.0, 0.0, 0.0)
    std = (1.0, 1.0, 1.0)

    def __call__(self, img):
        return [img.float() / 255]


class _Recording(CLIP):
    needs = CLIP.needs + ("indices",)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[dict] = []
        self.after_steps: list[float] = []  # the scale after each optimiser step's hook

    def after_optimizer_step(self):
        super().after_optimizer_step()
        self.after_steps.append(float(self.logit_scale.detach()))

    def forward(self, batch):
        self.seen.append({k: batch[k].clone() for k in ("input_ids", "attention_mask", "indices")}
                         | {"scale": self.logit_scale.detach().clone()})
        return super().forward(batch)


def _build(cfg, data):
    model = _Recording(encoder="small_cnn", dim=8, text_kwargs=dict(
        num_layers=1, hidden_size=16, num_heads=2, vocab_size=200, max_position_embeddings=12))
    with torch.no_grad():
        model.logit_scale.fill_(6.0)
    return model


def test_the_engine_carries_each_samples_tokens(tmp_path, fresh_accelerate):
    cfg = _Cfg(output_dir=str(tmp_path / "run"), seed=5)
    seen: list = []

    def build(c, data):
        m = _build(c, data)
        seen.append(m)
        return m

    result = train(cfg, build, lambda c: _OneView(), recipe="clip-test")
    assert result.steps_trained == 2 and result.latest("knn_top1") is not None
    ref = SeededDataset(get_dataset(DATA, "train", transform=_OneView()), seed=5)
    for step in seen[0].seen:
        assert step["input_ids"].shape == (16, 12)
        for row, index in enumerate(step["indices"].tolist()):
            _, _, fields, _ = ref[(0, index)]  # epoch 0: this sample's caption draw
            assert torch.equal(step["input_ids"][row], fields["input_ids"])
            assert torch.equal(step["attention_mask"][row], fields["attention_mask"])
    assert float(seen[0].seen[0]["scale"]) == pytest.approx(6.0)  # clamped inside forward
    # the loop's post-step hook ran once per optimiser step and left the clamped value
    assert len(seen[0].after_steps) == 2
    assert all(v <= math.log(100.0) + 1e-6 for v in seen[0].after_steps)


def test_the_post_step_hook_runs_once_per_optimiser_step_with_the_cache(tmp_path,
                                                                       fresh_accelerate):
    """Both towers in chunks of 8 (--grad-cache-chunk; CLIP refuses --grad-accum-steps): one
    forward on the whole batch and one post-step hook per optimiser step."""
    cfg = _Cfg(output_dir=str(tmp_path / "run"), grad_cache_chunk=8, max_steps=2, knn_every=0)
    seen: list = []

    def build(c, data):
        m = _build(c, data)
        seen.append(m)
        return m

    train(cfg, build, lambda c: _OneView(), recipe="clip-test")
    assert len(seen[0].seen) == 2 and len(seen[0].after_steps) == 2


def test_a_method_needing_fields_the_data_set_lacks_fails_before_training(tmp_path,
                                                                          fresh_accelerate):
    cfg = _Cfg(output_dir=str(tmp_path / "run"), data="shapes:n=48,size=16")
    with pytest.raises(ValueError, match=r"input_ids.*image-text data set"):
        train(cfg, _build, lambda c: _OneView(), recipe="clip-test")


def test_split_item_keeps_old_batches_and_rejects_odd_ones():
    v, y, i = [torch.zeros(2, 3, 4, 4)], torch.zeros(2), torch.arange(2)
    assert split_item((v, y, i))[3] == {}
    assert split_item((v, y, {"input_ids": i}, i))[3]["input_ids"] is i
    with pytest.raises(ValueError, match="5 parts"):
        split_item((v, y, i, i, i))
