"""Multi-crop end to end through recipes/simclr_cifar.py (2 x 32 px + 4 x 16 px views, both
augmentation paths), and --encoder-kwargs: a ViT at 32 px from the command line."""

from __future__ import annotations

import json

import pytest
import torch

MULTICROP = ["--data", "shapes:n=64,n_test=32,size=32", "--image-size", "32", "--encoder",
             "small_cnn", "--batch-size", "16", "--epochs", "1", "--max-steps", "3",
             "--num-workers", "0", "--progress", "false", "--log-every", "1",
             "--mixed-precision", "no", "--knn-every", "0", "--mlp-hidden", "32", "--dim", "16",
             "--warmup-epochs", "0", "--local-crops", "4", "--local-size", "16"]


@pytest.mark.parametrize("batched", ["on", "off"])
def test_simclr_cifar_trains_on_multicrop_views(batched, tmp_path, rx, monkeypatch,
                                                fresh_accelerate):
    from contrastive.engine import run
    from contrastive.methods import SimCLR
    from contrastive.methods import simclr as simclr_mod

    seen, losses = [], []
    forward, multiview = SimCLR.forward, simclr_mod.multiview_loss

    def recording_forward(self, batch):
        seen.append([(tuple(v.shape), v.dtype) for v in batch["views"]])
        return forward(self, batch)

    def recording_loss(*args, **kwargs):
        losses.append(multiview(*args, **kwargs).detach())
        return losses[-1] + 0 * args[0][0].sum()  # keep the graph

    monkeypatch.setattr(SimCLR, "forward", recording_forward)
    monkeypatch.setattr(simclr_mod, "multiview_loss", lambda *a, **k: recording_loss(*a, **k))
    mod = rx.load_recipe("simclr_cifar")
    out = tmp_path / "run"
    result = run(mod.SimCLRCifar, mod.build_method, mod.build_pipeline, name="simclr_cifar",
                 argv=[*MULTICROP, "--batched-augment", batched, "--output-dir", str(out)])
    assert result.status == "max_steps" and result.step == 3
    expected = [((16, 3, 32, 32), torch.float32)] * 2 + [((16, 3, 16, 16), torch.float32)] * 4
    assert seen == [expected] * 3  # every step: the 6 views reach the method
    assert len(losses) == 3 and all(torch.isfinite(x) for x in losses)  # the multi-crop loss
    records = [r for r in rx.read_metrics(out) if "loss" in r]
    assert [r["loss"] for r in records] == pytest.approx([float(x) for x in losses])
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["batched_augment"] == (batched == "on")
    pipeline = mod.build_pipeline(mod.SimCLRCifar())  # the eval CLIs read the run's normalisation
    assert config["resolved"]["normalisation"] == {"mean": list(pipeline.mean),
                                                   "std": list(pipeline.std)}


def test_a_vit_at_32_px_from_the_command_line(tmp_path, rx, capsys, fresh_accelerate):
    """--encoder-kwargs reaches create_encoder and is recorded for evaluation (before it, a timm
    ViT could not be trained at 32 px: "Input height (32) doesn't match model (224)")."""
    from contrastive.engine import parse_config, run

    mod = rx.load_recipe("mocov3_vit_small")
    out = tmp_path / "run"
    kwargs = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
    argv = [*rx.TINY, *rx.SMALL["mocov3_vit_small"], "--encoder", "timm:vit_tiny_patch16_224",
            "--image-size", "32", "--encoder-kwargs", json.dumps(kwargs), "--max-steps", "2",
            "--output-dir", str(out)]
    result = run(mod.MoCoV3ViTSmall, mod.build_method, mod.build_pipeline, argv=argv,
                 name="mocov3_vit_small")
    assert result.status == "max_steps"
    records = [r for r in rx.read_metrics(out) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] is not None for r in records)
    payload = torch.load(out / "encoder.pt", weights_only=True)
    assert payload["encoder"] == "timm:vit_tiny_patch16_224"
    assert payload["encoder_kwargs"] == kwargs
    from contrastive.eval.checkpoint import load_encoder

    enc = load_encoder(out / "encoder.pt").encoder  # rebuilt from the recorded kwargs
    assert enc(torch.randn(2, 3, 32, 32)).shape == (2, 32)
    with pytest.raises(SystemExit) as exc:  # bad JSON: exit 2 naming the flag, nothing built
        parse_config(rx.load_recipe("simclr_cifar").SimCLRCifar,
                     ["--data", "shapes", "--encoder-kwargs", "[1]"])
    assert exc.value.code == 2
    assert "--encoder-kwargs must be a JSON object" in capsys.readouterr().err
