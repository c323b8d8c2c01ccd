"""The runs of tests/eval/test_finetune.py's two-process check (not a test module; the
``two_process_runs`` fixture launches it, tests/launch_worker.py): ``contrastive-finetune``
through its ``main`` into ``folder/name``, on the generated image folder that ``prepare``
writes (:func:`make_image_folder`, also the other tests' data). Float64, BatchNorm statistics
frozen (a BN layer normalising with its batch's statistics cannot give 2 x B what it gives
1 x 2B), no mixup (it mixes each process's batch with itself), no validation images. The bug
the comparison must catch (``mutations``): the loss summed over each process's images instead
of averaged, so the gradient is no longer the global batch's mean.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn.functional as F

ARGS = ["--protocol", "sgd", "--encoder", "small_cnn", "--image-size", "32", "--batch-size",
        "8", "--steps", "3", "--float64", "--freeze-bn-stats", "true", "--val-fraction", "0",
        "--lr", "2.0", "--progress", "false", "--mixed-precision", "no", "--num-workers", "0",
        "--log-every", "1", "--save-every-steps", "0"]


def make_image_folder(root: Path, per_class: int = 12, test_per_class: int = 4,
                      classes: int = 4) -> Path:
    """``root/train/<class>/*.png`` and ``root/test/<class>/*.png``: generated shapes at
    32 px (``shapes``' first ``classes`` classes), ``per_class`` / ``test_per_class`` each."""
    from torchvision.transforms.functional import to_pil_image

    from contrastive.data import get_dataset

    for split, count, seed in (("train", per_class, 0), ("test", test_per_class, 1)):
        ds = get_dataset(f"shapes:n={count * 10},size=32,seed={seed}", "train")
        for i in range(len(ds)):
            img, label = ds[i]
            if label < classes:
                folder = root / split / ds.classes[label]
                folder.mkdir(parents=True, exist_ok=True)
                to_pil_image(img).save(folder / f"{i:03d}.png")
    return root


def prepare(folder: Path) -> None:
    make_image_folder(folder / "data")


def run(folder: Path, name: str) -> None:
    from contrastive.engine import reset_accelerate_state
    from contrastive.launch.finetune import main

    reset_accelerate_state()
    try:
        status = main([*ARGS, "--data", str(folder / "data"), "--output-dir",
                       str(folder / name)])
    finally:
        reset_accelerate_state()
    if status:
        raise SystemExit(f"contrastive-finetune ended with status {status}")


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.methods.image_classifier as ic

    def summed(logits, labels, smoothing=0.0):  # the bug: a sum over the process's images
        return F.cross_entropy(logits, labels.long(), reduction="sum")

    return [(ic, "classification_loss", summed)]
