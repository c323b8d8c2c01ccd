"""The evaluation tools under ``accelerate launch`` with 2 CPU processes (gloo).

Each process encodes its shard of the data; ``gather_for_metrics`` must return every sample
exactly once (the last uneven batch is padded by the sampler and trimmed again), so the results
equal the one-process ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("contrastive.data")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from test_eval_tools import COMMON, make_imagefolder  # noqa: E402


@pytest.mark.distributed
def test_two_processes_give_the_one_process_results(tmp_path, launch_two):
    from contrastive.nn import create_encoder

    # 13 and 5 images per class: uneven shards and a ragged last batch of 4
    data = make_imagefolder(tmp_path / "data", {"train": 13, "val": 5})
    torch.manual_seed(0)
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict()},
               tmp_path / "encoder.pt")
    args = ["--checkpoint", str(tmp_path / "encoder.pt"), "--data", str(data), *COMMON, "--batch-size", "4"]
    from contrastive.eval.cli import knn_eval_main, linear_eval_main

    mains = {"knn_eval": knn_eval_main, "linear_eval": linear_eval_main}
    # the kNN tool only: the linear probe's cached protocol extracts features through the same
    # encode_split / gather_for_metrics path (one launch keeps the default suite short)
    for tool, extra in (("knn_eval", ["--k", "5"]),):
        one_out, two_out = tmp_path / f"{tool}_1.json", tmp_path / f"{tool}_2.json"
        mains[tool]([*args, *extra, "--output", str(one_out)])  # one process, in this one
        launch_two(ROOT / "tools" / f"{tool}.py", *args, *extra, "--output", two_out,
                   timeout=300, engine=False)
        one, two = json.loads(one_out.read_text()), json.loads(two_out.read_text())
        assert (two["num_train"], two["num_test"]) == (39, 15) == (one["num_train"], one["num_test"])
        assert two["top1"] == pytest.approx(one["top1"]) and two["top5"] == pytest.approx(one["top5"])
