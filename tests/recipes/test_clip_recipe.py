"""recipes/clip.py: CLIP through the engine on image-caption data (shapes-captions, a caption
folder), its run folder (clip.pt + tokenizer/ that contrastive-zeroshot reads, encoder.pt,
metrics with samples/s and the zero-shot evaluator's records), keep-best, and 2 processes
(``accelerate launch --multi_gpu --num_processes 2``, the session's one launch of
tests/launch_worker.py) equal to 1 with the same global batch in
float64 through the recipe, which a gather without gradient breaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contrastive.engine import reset_accelerate_state

pytest.importorskip("transformers")

TINY_CLIP = ["--data", "shapes-captions:n=48,n_test=20,size=16,max_length=12", "--image-size",
             "16", "--batch-size", "16", "--steps", "3", "--warmup-steps", "1", "--dim", "8",
             "--layers", "1", "--hidden", "16", "--eval-max", "20", "--progress",
             "false", "--log-every", "1", "--mixed-precision", "no", "--num-workers", "0"]


def _main(rx, argv):
    """recipes/clip.py as a program, in this process."""
    reset_accelerate_state()
    try:
        return rx.load_recipe("clip").main(argv)
    finally:
        reset_accelerate_state()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, rx):
    out = tmp_path_factory.mktemp("clip") / "run"
    return out, _main(rx, [*TINY_CLIP, "--output-dir", str(out)])


def test_the_recipe_trains_through_the_engine_and_leaves_a_readable_run(tiny_run, rx):
    out, result = tiny_run
    assert result.status == "completed" and result.step == 3
    recs = rx.read_metrics(out)
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all("samples_per_s" in r and "images_per_s" not in r for r in steps)
    assert steps[0]["lr"] == 0.0 and steps[1]["lr"] == pytest.approx(2e-3)  # 1 warm-up step
    ends = [r for r in recs if r.get("zeroshot_when") == "end"]
    assert len(ends) == 1 and {"zeroshot_top1", "image_to_text_R@1"} <= set(ends[0])
    assert json.loads((out / "run_state.json").read_text())["state"] == "completed"
    config = json.loads((out / "config.json").read_text())
    assert "knn_every" not in config and "batched_augment" not in config  # no image fields
    blob = torch.load(out / "clip.pt", weights_only=True)
    assert "logit_scale" in blob["state_dict"] and blob["config"]["step"] == 3
    assert torch.load(out / "encoder.pt", weights_only=True)["encoder"] == "small_cnn"
    from contrastive.eval.zeroshot import evaluate_run

    again = evaluate_run([str(out), "--n-test", "20"])
    assert again["top1"] == pytest.approx(ends[0]["zeroshot_top1"], abs=1e-3)


def test_a_caption_folder_and_keep_best(tmp_path, rx):
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir()
    lines = ["image\tcaption"]
    for i in range(20):
        colour = (255 * (i % 2), 40 * (i % 5), 0)
        Image.new("RGB", (20, 18), colour).save(root / f"{i}.png")
        lines.append(f"{i}.png\ta {'red' if i % 2 else 'dark'} square number {i % 5}")
    (root / "captions.tsv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    argv = [*TINY_CLIP, "--data", f"captions:{root}", "--batch-size", "8", "--steps", "2",
            "--eval-every", "1", "--keep-best", "image_to_text_R@1", "--output-dir", str(out)]
    result = _main(rx, argv)
    assert result.step == 2
    recs = [r for r in rx.read_metrics(out) if "zeroshot_when" in r]
    assert [r["zeroshot_when"] for r in recs] == ["step 1", "step 2"]
    assert "zeroshot_top1" not in recs[0]  # no labels: retrieval only
    assert (out / "best" / "clip.pt").is_file()
    best = torch.load(out / "checkpoints" / "step_00000002" / "best.pt", weights_only=True)
    assert best["metric"] == "image_to_text_R@1" and best["value"] == max(
        r["image_to_text_R@1"] for r in recs)


# ---- 2 processes == 1 process, through the recipe, in float64 ---------------------------------

RUNS = Path(__file__).with_name("clip_dist_runs.py")  # the runs, their settings and the bug


def _weights(folder):
    return torch.load(folder / "clip.pt", weights_only=True)["state_dict"]


def _gap(a, b):
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.distributed
def test_two_processes_equal_one_through_the_recipe_and_a_gradless_gather_fails(rx,
                                                                                two_process_runs):
    folder = two_process_runs(RUNS)  # 2 processes, and 2 with the bug: the session's launch
    two_process_runs.module(RUNS).run(folder, "one")  # 1 process, in this one
    one, two, mutant = (_weights(folder / name) for name in ("one", "two", "mutant"))
    assert one["logit_scale"].dtype == torch.float64
    # float64: only rounding of sums taken in another order (~1e-13 after 3 AdamW steps); a
    # wrong gather, rank offset or gradient average moves weights by > 1e-4 at once
    assert _gap(one, two) < 1e-9
    losses = [[r["loss"] for r in rx.read_metrics(folder / d) if "loss" in r]
              for d in ("one", "two")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=2e-6)  # 6 decimals
    assert _gap(one, mutant) > 1e-6
    print(f"2 vs 1 process: max |weight difference| {_gap(one, two):.2e}; a gather without "
          f"gradient: {_gap(one, mutant):.2e}")
