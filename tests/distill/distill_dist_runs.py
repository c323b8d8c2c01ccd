"""The runs of tests/distill/test_pretrained_teacher.py's two-process check (not a test module;
the ``two_process_runs`` fixture launches it, tests/launch_worker.py): recipes/distill_cosnce.py
in float64 with the pretrained EfficientNet-Lite0 file as the teacher (its input re-normalised
to mean = std = 0.5; its BatchNorm in eval mode: per-sample) and a 1-block ViT student (LayerNorm
only, no dropout: nothing that depends on the process) started from ``--init``; 3 AdamW steps,
the last one in stage 2 (CE on the labels through the student head). The bug the comparison must
catch: COS-NCE's negatives taken from the local rows only (the other process's not gathered).
Without the EfficientNet file nothing runs (the test skips)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from launch_worker import run_recipe_main  # noqa: E402

LITE0 = (Path(__file__).resolve().parents[3] / "shared" / "data" / "image-models"
         / "efficientnet_lite0" / "model.safetensors")
STUDENT = {"img_size": 32, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}
DIST = ["--data", "shapes:n=64,size=32", "--image-size", "32", "--batch-size", "16",
        "--steps", "3", "--stage1-fraction", "0.5", "--float64", "--mixed-precision", "no",
        "--num-workers", "0", "--no-progress", "--log-every", "1", "--save-every-steps", "0",
        "--batched-augment", "off",  # per image, drawn from the sample: the same in 1 or 2
        "--teacher", "timm:efficientnet_lite0", "--teacher-checkpoint", str(LITE0),
        "--teacher-mean", "0.5", "0.5", "0.5", "--teacher-std", "0.5", "0.5", "0.5",
        "--student", "timm:vit_tiny_patch16_224", "--student-kwargs", json.dumps(STUDENT)]


def prepare(folder: Path) -> None:
    """The student's --init file: a random 1-block ViT of its own seed."""
    import torch

    from contrastive.nn import create_encoder

    torch.manual_seed(7)
    torch.save(create_encoder("timm:vit_tiny_patch16_224", **STUDENT).state_dict(),
               folder / "student_init.pt")


def run(folder: Path, name: str) -> None:
    if LITE0.is_file():
        run_recipe_main("distill_cosnce", [*DIST, "--init", str(folder / "student_init.pt")],
                        folder / name)


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.methods.distill_parts as parts

    return [(parts, "world_size", lambda: 1)]
