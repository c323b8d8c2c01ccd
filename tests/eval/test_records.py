"""encoder.pt and the run-folder layout, defined once in contrastive.records: the engine writes
them, evaluation reads them by their fields."""

from __future__ import annotations

import json

import pytest
import torch

from contrastive.eval.checkpoint import load_encoder, read_checkpoint
from contrastive.nn import create_encoder
from contrastive.records import (
    SCHEMA,
    EncoderRecord,
    RecordError,
    encoder_fields_from_config,
    find_latest,
    resolve_run_path,
)

VIT = "timm:vit_tiny_patch16_224"
VIT_KWARGS = {"img_size": 32, "patch_size": 8}


def _perturbed(name: str, **kwargs):
    torch.manual_seed(0)
    enc = create_encoder(name, **kwargs)
    with torch.no_grad():
        for t in enc.state_dict().values():
            if t.is_floating_point():
                t.add_(0.01 * torch.randn(t.shape))
    return enc.eval()


def _same_outputs(a, b, size=32) -> bool:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.equal(a(x), b(x))


def test_record_round_trip_by_fields(tmp_path):
    enc = _perturbed("small_cnn")
    path = EncoderRecord.from_module(enc, "small_cnn", mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2),
                                     image_size=32, step=9, recipe="r", method="M").save(
        tmp_path / "encoder.pt")
    payload = torch.load(path, weights_only=True)  # plain values and tensors only
    assert payload["schema"] == SCHEMA and payload["encoder"] == "small_cnn"
    loaded = load_encoder(path)
    assert (loaded.image_size, loaded.mean, loaded.std) == (32, [0.5, 0.4, 0.3], [0.2, 0.2, 0.2])
    assert loaded.setting("step") == 9 and loaded.kind == "encoder.pt"
    assert _same_outputs(loaded.encoder, enc)


def test_encoder_pt_written_by_main_83e79be_still_loads(tmp_path):
    """The payload today's main (83e79be, ``save_encoder``) writes: no schema field."""
    enc = _perturbed("small_cnn")
    payload = {"encoder": "small_cnn", "state_dict": enc.state_dict(), "num_features": 256,
               "recipe": "moco_cifar", "step": 7, "method": "MoCo", "image_size": 32,
               "mean": [0.4914, 0.4822, 0.4465], "std": [0.247, 0.243, 0.261]}
    torch.save(payload, tmp_path / "encoder.pt")
    record = EncoderRecord.load(tmp_path / "encoder.pt")
    assert record.schema == 0 and record.step == 7 and record.encoder_kwargs == {}
    loaded = load_encoder(tmp_path)  # the run folder resolves to its encoder.pt
    assert loaded.image_size == 32 and loaded.mean == payload["mean"]
    assert _same_outputs(loaded.encoder, enc)


def test_a_newer_schema_is_a_clear_error(tmp_path):
    enc = create_encoder("small_cnn")
    torch.save({"schema": SCHEMA + 1, "encoder": "small_cnn", "state_dict": enc.state_dict()},
               tmp_path / "encoder.pt")
    with pytest.raises(RecordError, match="upgrade contrastive"):
        EncoderRecord.load(tmp_path / "encoder.pt")
    with pytest.raises(ValueError, match="upgrade contrastive"):
        load_encoder(tmp_path / "encoder.pt")


def _checkpoint_run(tmp_path, enc, config):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    folder = run / "checkpoints" / "step_00000004"
    folder.mkdir(parents=True)
    save_file({f"encoder.{k}": v.contiguous() for k, v in enc.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "meta.json").write_text(json.dumps({"config": config}))
    return run, folder


def test_run_folder_config_encoder_kwargs_json_string_rebuilds_the_vit(tmp_path):
    """config.json holds --encoder-kwargs as the JSON string the command line gave."""
    enc = _perturbed(VIT, **VIT_KWARGS)
    config = {"encoder": VIT, "encoder_kwargs": json.dumps(VIT_KWARGS), "image_size": 32}
    run, _ = _checkpoint_run(tmp_path, enc, config)
    (run / "config.json").write_text(json.dumps(config))
    loaded = load_encoder(run)
    assert loaded.kind == "accelerate" and loaded.image_size == 32
    assert _same_outputs(loaded.encoder, enc)


def test_resolved_encoder_kwargs_win_and_meta_config_serves_a_moved_checkpoint(tmp_path):
    """``resolved.encoder_kwargs`` holds what the recipe added (e.g. num_heads); a checkpoint
    folder copied out of its run reads the configuration in its own meta.json."""
    enc = _perturbed(VIT, **VIT_KWARGS)
    config = {"encoder": VIT, "encoder_kwargs": "", "image_size": 32,
              "resolved": {"encoder_kwargs": VIT_KWARGS}}
    _, folder = _checkpoint_run(tmp_path, enc, config)
    assert _same_outputs(load_encoder(folder).encoder, enc)
    moved = folder.rename(tmp_path / "elsewhere")
    raw = read_checkpoint(moved)
    assert raw.encoder_name == VIT and raw.settings["encoder_kwargs"] == VIT_KWARGS


def test_a_checkpoint_folder_gives_the_normalisation_its_run_recorded(tmp_path):
    """config.json's resolved.normalisation (the image pipeline's) reaches the eval CLIs for a
    training checkpoint folder, as encoder.pt's does (before: ImageNet's, whatever the run used)."""
    enc = _perturbed(VIT, **VIT_KWARGS)
    norm = {"mean": [0.25, 0.5, 0.75], "std": [0.1, 0.2, 0.3]}
    config = {"encoder": VIT, "encoder_kwargs": "", "image_size": 32,
              "resolved": {"encoder_kwargs": VIT_KWARGS, "normalisation": norm}}
    _, folder = _checkpoint_run(tmp_path, enc, config)
    loaded = load_encoder(folder)
    assert (loaded.mean, loaded.std) == (norm["mean"], norm["std"])
    config["resolved"].pop("normalisation")  # a run written before it was recorded
    _, older = _checkpoint_run(tmp_path / "older", enc, config)
    assert (load_encoder(older).mean, load_encoder(older).std) == (None, None)


def test_config_fields_are_read_by_name_not_searched():
    nested = {"method": {"encoder": "small_cnn", "image_size": 64}}
    assert encoder_fields_from_config(nested) == {"encoder": None, "encoder_kwargs": {},
                                                  "image_size": None, "mean": None, "std": None}
    with pytest.raises(RecordError, match="not JSON"):
        encoder_fields_from_config({"encoder": "small_cnn", "encoder_kwargs": "{img_size: 32}"})


def test_run_layout_newest_complete_checkpoint(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for name, complete in (("step_00000002", True), ("step_00000010", True),
                           ("step_00000011", False), (".tmp-step_00000012", True)):
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / "meta.json").write_text("{}")
    assert find_latest(root) == root / "step_00000010"
    assert resolve_run_path(tmp_path / "run") == root / "step_00000010"
    assert resolve_run_path(root / "step_00000002") == root / "step_00000002"
    with pytest.raises(FileNotFoundError, match="pass an encoder.pt, a run folder"):
        resolve_run_path(tmp_path)
