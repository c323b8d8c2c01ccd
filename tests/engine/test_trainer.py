"""The training loop in-process with a toy method: non-finite losses, accumulation, outputs."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
import torch
from torch import nn

from contrastive.engine import NonFiniteLossError, TrainConfig, train


@dataclasses.dataclass
class _Cfg(TrainConfig):
    data: str = "synthetic:n=64,size=16"
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 2
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 2
    save_every_epochs: int = 0
    log_every: int = 1
    nan_at: int = -1  # the step whose loss is NaN


class _Toy(nn.Module):
    """Pulls the two views' features together; loss NaN at optimiser step ``nan_at``."""

    uses_in_batch_negatives = True

    def __init__(self, nan_at: int) -> None:
        super().__init__()
        from contrastive.nn import create_encoder

        self.encoder = create_encoder("small_cnn")
        self.nan_at, self.calls = nan_at, 0

    def forward(self, views, momentum=None, step=None):
        a, b = (nn.functional.normalize(self.encoder(v), dim=1) for v in views)
        loss = (a - b).pow(2).sum(1).mean()
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        call_index = torch.tensor(self.calls)  # a method-specific scalar: logged like the others
        self.calls += 1
        return {"loss": loss, "pos_acc": torch.tensor(50.0), "call_index": call_index,
                "step_seen": torch.tensor(float(step)), "embeddings": a.detach()}


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size)


def _train(tmp_path, **kw):
    cfg = _Cfg(output_dir=str(tmp_path / "run"), **kw)
    return train(cfg, lambda c: _Toy(c.nan_at), _pipeline, recipe="toy")


def test_nonfinite_loss_stops_naming_the_step_and_keeps_good_checkpoint(tmp_path,
                                                                     fresh_accelerate):
    with pytest.raises(NonFiniteLossError, match=r"at step 2\. The last good checkpoint is "
                                                 r"step 2"):
        _train(tmp_path, nan_at=2, log_every=4)  # checked when step 4 would be saved
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_00000002"]  # nothing written from the broken weights
    assert not (tmp_path / "run" / "encoder.pt").exists()


def test_nonfinite_loss_skip_continues(tmp_path, fresh_accelerate, caplog):
    caplog.set_level(logging.WARNING)
    result = _train(tmp_path, nan_at=2, on_nonfinite="skip")
    assert result.status == "completed" and result.step == 8
    assert "non-finite loss at step 2" in caplog.text and "skipping" in caplog.text
    payload = torch.load(result.encoder_path, weights_only=True)
    assert all(torch.isfinite(v).all() for v in payload["state_dict"].values()
               if v.is_floating_point())
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    assert all(math.isfinite(r["loss"]) for r in lines if "loss" in r)


def test_accumulation_with_in_batch_negatives_warns_and_counts_steps(tmp_path, fresh_accelerate,
                                                                     caplog):
    caplog.set_level(logging.WARNING)
    result = _train(tmp_path, grad_accum_steps=2, max_steps=3)
    assert "NOT a bigger contrastive batch" in caplog.text
    assert result.status == "max_steps" and result.step == 3
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "meta.json")
                      .read_text())
    assert meta["micro_in_epoch"] == 6  # 2 micro-batches of 8 per optimiser step
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["resolved"]["per_process_micro_batch"] == 8


def test_encoder_file_is_plain_backbone(tmp_path, fresh_accelerate):
    result = _train(tmp_path, max_steps=1)
    payload = torch.load(result.encoder_path, weights_only=True)
    from contrastive.nn import create_encoder

    assert payload["encoder"] == "small_cnn" and payload["step"] == 1
    assert payload["method"] == "_Toy" and payload["num_features"] == 256
    create_encoder("small_cnn").load_state_dict(payload["state_dict"], strict=True)


def test_every_scalar_the_method_returns_is_logged_as_a_window_mean(tmp_path, fresh_accelerate):
    _train(tmp_path, max_steps=4, log_every=2)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    records = [r for r in lines if "loss" in r]
    assert [r["step"] for r in records] == [2, 4]
    assert [r["call_index"] for r in records] == [0.5, 2.5]  # means of calls (0, 1) and (2, 3)
    assert all(r["pos_acc"] == 50.0 and "embeddings" not in r for r in records)


def test_methods_that_take_step_get_the_optimiser_step(tmp_path, fresh_accelerate):
    _train(tmp_path, max_steps=3, log_every=1, grad_accum_steps=2)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    records = [r for r in lines if "loss" in r]
    # both micro-batches of optimiser step s (0-based) see step=s; forward calls keep counting
    assert [r["step_seen"] for r in records] == [0.0, 1.0, 2.0]
    assert [r["call_index"] for r in records] == [0.5, 2.5, 4.5]
