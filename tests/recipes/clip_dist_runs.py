"""The runs of tests/recipes/test_clip_recipe.py's two-process check (not a test module; the
``two_process_runs`` fixture launches it, tests/launch_worker.py): recipes/clip.py in float64
with nothing that depends on the process (a 1-block ViT, LayerNorm only, instead of
small_cnn's BN over each process's half; no dropout, whose masks are per process). The bug the
comparison must catch: CLIP's gather keeps only the local rows' gradient (the other processes'
rows gathered without it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from gather_mutant import gather_local_grad  # noqa: E402
from launch_worker import run_recipe_main  # noqa: E402

DIST = ["--data", "shapes-captions:n=64,n_test=20,size=16,max_length=12", "--image-size", "16",
        "--batch-size", "16", "--steps", "3", "--warmup-steps", "1", "--dim", "8",
        "--layers", "1", "--hidden", "16", "--eval-max", "0", "--progress", "false",
        "--log-every", "1", "--mixed-precision", "no", "--num-workers", "0",
        "--encoder", "timm:vit_tiny_patch16_224", "--encoder-kwargs",
        '{"img_size": 16, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}',
        "--dropout", "0", "--float64", "--save-every-steps", "0"]


def run(folder: Path, name: str) -> None:
    run_recipe_main("clip", DIST, folder / name)


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.methods.clip as clip_module

    return [(clip_module, "gather_with_grad", gather_local_grad)]
