"""``contrastive-finetune`` (contrastive/launch/finetune.py, the labelled-image kit): a resumed
run equals the uninterrupted one, two processes equal one, the low-label subset is
class-balanced, seeded and read from a list file, layer-wise lr decay reaches the optimiser's
groups, the mixup path trains, the classifier folder loads in one line, bad input is one line.
Tiny encoders (small_cnn, a 2-block timm ViT) on generated 32 px images."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from contrastive.engine.kits.labelled_image import (
    LabelledImageAdapter,
    read_subset_file,
    split_indices,
)
from contrastive.launch.finetune import SgdFinetuneConfig, VitFinetuneConfig, load_finetuned, main

RUNS = Path(__file__).with_name("finetune_dist_runs.py")  # the two-process runs, their data
_spec = importlib.util.spec_from_file_location("finetune_dist_runs", RUNS)
assert _spec is not None and _spec.loader is not None
runs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs_module)

SMALL = ["--protocol", "sgd", "--encoder", "small_cnn", "--image-size", "32", "--batch-size",
         "8", "--progress", "false", "--mixed-precision", "no", "--num-workers", "0",
         "--log-every", "1", "--val-fraction", "0.25"]
VIT_KWARGS = '{"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 16, "num_heads": 2}'


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return runs_module.make_image_folder(tmp_path_factory.mktemp("ft") / "data")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "classifier" / "model.safetensors"))


def test_resume_is_exact_with_mixup_and_the_classifier_loads(data: Path, tmp_path: Path) -> None:
    # mixup / cutmix / smoothing and a validation every 2 steps: every draw must resume
    args = [*SMALL, "--data", str(data), "--steps", "6", "--eval-every", "2", "--mixup", "0.8",
            "--cutmix", "1.0", "--smoothing", "0.1", "--save-every-steps", "3"]
    assert main([*args, "--output-dir", str(tmp_path / "whole")]) == 0
    assert main([*args, "--max-steps", "3", "--output-dir", str(tmp_path / "cut")]) == 0
    assert main([*args, "--resume", "auto", "--output-dir", str(tmp_path / "cut")]) == 0
    whole, resumed = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert results["step"] == 6 and results["train_images"] == 36 and results["val_images"] == 12
    assert {"val_top1", "val_top5", "test_top1", "test_top5"} <= results.keys()
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 6 and all(0 < v < 20 for v in losses)
    assert [r["step"] for r in records if "val_top1" in r] == [2, 4, 6]
    # the classifier folder in one line: logits of 4 classes, the trained weights
    model = load_finetuned(tmp_path / "whole" / "classifier")
    assert torch.equal(model.head.weight, whole["head.weight"])
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 4)


def test_mixup_batch_is_seeded_by_the_position(data: Path) -> None:
    cfg = SgdFinetuneConfig(data=str(data), encoder="small_cnn", image_size=32, batch_size=8,
                            mixup=0.8, cutmix=1.0, smoothing=0.1)
    adapter = LabelledImageAdapter()
    adapter.prepare(cfg)
    adapter.train_set(cfg, None)
    images, labels = torch.rand(8, 3, 32, 32), torch.arange(8) % 4

    def mixed(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = adapter.batch((images.clone(), labels), ("views", "labels"), {},
                              device=torch.device("cpu"), step=step, micro=0, rank=0)
        return batch["views"][0], batch["labels"]

    (x0, y0), (x0b, y0b), (x1, _) = mixed(0), mixed(0), mixed(1)
    assert y0.shape == (8, 4) and torch.allclose(y0.sum(1), torch.ones(8))
    assert y0.max() < 1.0  # smoothed, and mixed
    assert torch.equal(x0, x0b) and torch.equal(y0, y0b) and not torch.equal(x0, x1)


def test_layer_decay_scales_reach_the_optimiser(data: Path) -> None:
    from contrastive.engine.handoff import DataInfo
    from contrastive.engine.optim import build_optimizer, set_lr
    from contrastive.launch.finetune import build_method

    decay, depth = 0.5, 2
    cfg = VitFinetuneConfig(data=str(data), encoder="timm:vit_tiny_patch16_224",
                            encoder_kwargs=VIT_KWARGS, image_size=32, batch_size=8,
                            layer_decay=decay)
    adapter = LabelledImageAdapter()
    adapter.prepare(cfg)
    assert cfg.drop_path == 0.1  # the protocol's, for a timm encoder
    info = DataInfo(train_size=36, steps_per_epoch=4, total_steps=4, global_batch=8,
                    micro_batch=8, world_size=1, num_classes=4)
    with adapter.method_building(cfg):
        method = build_method(cfg, info)
    opt = build_optimizer(method, "adamw", lr=1.0, weight_decay=0.05,
                          extra_groups=adapter.param_groups(cfg, method))
    set_lr(opt, 1e-3)

    def layer(name: str) -> int:  # MAE's lr_decay.py: embeddings 0, block i -> i + 1, the rest L + 1
        if name.startswith("encoder.blocks."):
            return int(name.split(".")[2]) + 1
        return depth + 1 if name.startswith(("encoder.norm", "head")) else 0

    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in method.named_parameters():
        assert lr_of[id(p)] == pytest.approx(1e-3 * decay ** (depth + 1 - layer(name))), name
    assert lr_of[id(method.encoder.blocks[-1].mlp.fc1.weight)] == pytest.approx(1e-3 * decay)


def test_subset_is_class_balanced_seeded_and_read_from_a_list(data: Path, tmp_path: Path) -> None:
    from contrastive.data import ImageFolderDataset

    targets = [c for c in range(4) for _ in range(100)]
    train, val = split_indices(targets, val_fraction=0.1, label_fraction=0.1, seed=3)
    assert [sum(targets[i] == c for i in train) for c in range(4)] == [10] * 4
    assert [sum(targets[i] == c for i in val) for c in range(4)] == [9] * 4  # of the other 90
    assert not set(train) & set(val)
    assert split_indices(targets, val_fraction=0.1, label_fraction=0.1, seed=3) == (train, val)
    assert split_indices(targets, val_fraction=0.1, label_fraction=0.1, seed=4)[0] != train
    ds = ImageFolderDataset(data / "train")
    rel = [str(Path(ds.paths[i]).relative_to(ds.root)) for i in (0, 13, 30)]
    listing = tmp_path / "subset.txt"
    listing.write_text(f"# SimCLR-style list\n{rel[0]}\n{rel[1]}\n\n{rel[2]}\n47\n")
    picked = read_subset_file(listing, ds)
    assert picked == [0, 13, 30, 47]
    train, val = split_indices(ds.targets, val_fraction=0.25, subset=picked, seed=0)
    assert train == picked and not set(val) & set(picked)


@pytest.mark.parametrize("bad, message", [
    (["--data", "/nonexistent/folder"], "/nonexistent/folder"),
    (["--init", "hf:/some/text-model"], "text encoders"),
    (["--init", "{text}"], "--init"),
    (["--subset-file", "{subset}"], "has no training image left"),
])
def test_bad_input_is_one_line(data: Path, tmp_path: Path, capsys, bad, message) -> None:
    text, subset = tmp_path / "notes.txt", tmp_path / "subset.txt"
    text.write_text("not weights\n")
    subset.write_text("0\n1\n")  # two images of one class: the others have none
    bad = [b.replace("{text}", str(text)).replace("{subset}", str(subset)) for b in bad]
    args = [*SMALL, "--data", str(data), "--steps", "1", *bad]
    assert main([*args, "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.distributed
def test_two_processes_equal_one_and_the_mutant_differs(two_process_runs) -> None:
    folder = two_process_runs(RUNS)
    two_process_runs.module(RUNS).run(folder, "one")
    one, two, mutant = (_weights(folder / name) for name in ("one", "two", "mutant"))
    assert one["head.weight"].dtype == torch.float32  # the classifier file is float32
    gap = max(float((one[k] - two[k]).abs().max()) for k in one)
    bug = max(float((one[k] - mutant[k]).abs().max()) for k in one)
    print(f"2 vs 1 process max |weight difference| {gap:.2e}; mutant {bug:.2e}")
    assert gap < 1e-6  # float64 training, float32 file: rounding only
    assert bug > 1e-3


def test_an_encoder_pt_gives_its_architecture_size_and_normalisation(data: Path,
                                                                    tmp_path: Path) -> None:
    from contrastive.nn import create_encoder
    from contrastive.records import EncoderRecord

    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    EncoderRecord.from_module(create_encoder("small_cnn"), "small_cnn", mean=mean, std=std,
                              image_size=40).save(tmp_path / "encoder.pt")
    cfg = VitFinetuneConfig(data=str(data), init=str(tmp_path / "encoder.pt"), batch_size=8)
    adapter = LabelledImageAdapter()
    adapter.prepare(cfg)
    assert (cfg.encoder, cfg.image_size, cfg.drop_path, cfg.layer_decay) == ("small_cnn", 40,
                                                                               0.0, 1.0)
    assert adapter.normalisation == (mean, std)
    _, evaluate = adapter.transforms(cfg)
    image = evaluate(torch.full((3, 32, 32), 255, dtype=torch.uint8))
    assert image.shape == (3, 40, 40)
    assert torch.allclose(image[:, 0, 0], (1 - torch.tensor(mean)) / torch.tensor(std))
