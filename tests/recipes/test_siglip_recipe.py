"""recipes/siglip.py: SigLIP through the engine on shapes-captions (CLIP's recipe conventions),
its run folder (clip.pt recording the method, so contrastive-zeroshot rebuilds SigLIP and finds
the same zero-shot accuracy) and the learnt t', b in the metrics."""

from __future__ import annotations

import logging
import math

import pytest
import torch

pytest.importorskip("transformers")

from contrastive.engine import reset_accelerate_state  # noqa: E402

from .test_clip_recipe import TINY_CLIP  # noqa: E402


def test_the_recipe_trains_and_zero_shot_reloads_siglip(tmp_path, rx, caplog):
    out = tmp_path / "run"
    reset_accelerate_state()
    try:
        with caplog.at_level(logging.INFO, logger="contrastive.engine.trainer"):
            result = rx.load_recipe("siglip").main([*TINY_CLIP, "--output-dir", str(out)])
    finally:
        reset_accelerate_state()
    assert result.status == "completed" and result.step == 3
    # the end line names the method trained (the shared image-text artefacts said "CLIP")
    end = [r.getMessage() for r in caplog.records if r.getMessage().startswith("completed at")]
    assert len(end) == 1 and "the SigLIP model" in end[0] and "CLIP" not in end[0], end
    recs = rx.read_metrics(out)
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert steps[0]["logit_scale"] == pytest.approx(10.0) and steps[0]["logit_bias"] == -10.0
    assert all(math.isfinite(r["loss"]) for r in steps)
    ends = [r for r in recs if r.get("zeroshot_when") == "end"]
    assert len(ends) == 1 and "zeroshot_top1" in ends[0]
    blob = torch.load(out / "clip.pt", weights_only=True)
    assert blob["config"]["method"] == "siglip"
    assert "criterion.bias" in blob["state_dict"] and "logit_scale" not in blob["state_dict"]
    from contrastive.eval.zeroshot import evaluate_run, load_clip_run

    assert type(load_clip_run(out)[0]).__name__ == "SigLIP"
    again = evaluate_run([str(out), "--n-test", "20"])
    assert again["top1"] == pytest.approx(ends[0]["zeroshot_top1"], abs=1e-3)
