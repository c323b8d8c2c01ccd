"""``--fsdp``: FSDP2 (``fully_shard``) applied by the engine (contrastive/engine/sharding.py).

The default tests check the refusals and the helpers' plain path in a second. The slow ones
launch two gloo CPU processes once (tests/engine/fsdp_case.py: four runs of a depth-2 ViT
recipe in float64) and check that

- every parameter of the trained method is a DTensor sharded on dim 0, each rank holding about
  half of the values (the sharding really happened; the plain DDP path would hold them all);
- the run equals ONE process with the same global batch (the heads' BatchNorm split in two
  groups, as the two processes normalise their halves), weights and losses in float64 with the
  two-process tests' tolerance, the momentum encoder (updated shard by shard) included;
- a factor-2 gradient (FSDP's reduce-scatter summing instead of averaging, what gloo's has been
  reported to do) moves the weights far outside that tolerance: the comparison can fail;
- a run stopped one step early and resumed ends with the uninterrupted run's fingerprints
  (model, optimiser state gathered from the shards, random generators);
- a pickle planted in the sharded run's checkpoint never runs: the resume refuses the file.

The recipe trains with SGD: Adam's update is nearly invariant to the gradient's scale, so it
would hide a factor 2.

CLIP and SigLIP (recipes/clip.py, recipes/siglip.py: a depth-2 ViT, a 2-layer BERT) are launched
once each with ``--fsdp`` and checked against ONE process: both towers' parameters sharded, the
loss's 0-dim scale (and SigLIP's bias) whole and equal on both ranks, weights and losses equal
in float64; CLIP's gather without its gradient (tests/gather_mutant.py) moves the weights far
outside the tolerance. A scale whose gradient is not averaged (the hook of
``sharding.replicate_scalars`` removed) parts the ranks' scales: checked by hand, not in the
suite (a launch more).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from contrastive.engine.checkpoint import OPTIMIZER_FILE
from contrastive.engine.sharding import (
    ShardingError,
    check_fsdp,
    full_state,
    shard_method,
    shard_optimizer_state,
    sharded_fused,
)

CASE = Path(__file__).with_name("fsdp_case.py")
TESTS = Path(__file__).resolve().parents[1]


# ---- refusals and the plain path (default suite) -------------------------------------------


def test_refusals_name_the_fix():
    with pytest.raises(ShardingError, match="one: launch several"):
        check_fsdp(1, cached=False, compile=False)
    with pytest.raises(ShardingError, match="gradient caching"):
        check_fsdp(2, cached=True, compile=False)
    with pytest.raises(ShardingError, match="--compile"):
        check_fsdp(2, cached=False, compile=True)
    check_fsdp(2, cached=False, compile=False)
    with pytest.raises(ShardingError, match="lars"):
        sharded_fused("lars", None)
    with pytest.raises(ShardingError, match="--fused-optimizer false"):
        sharded_fused("sgd", True)
    assert sharded_fused("sgd", None) is False and sharded_fused("adamw", None) is None


def test_a_method_without_blocks_is_refused_before_any_collective():
    method = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(ShardingError, match="Sequential has no transformer blocks"):
        shard_method(method, torch.device("cpu"), 2)
    text_alone = nn.Sequential()  # a Hugging Face encoder's layers without an image tower
    text_alone.layer = nn.ModuleList([nn.Linear(4, 4)])
    with pytest.raises(ShardingError, match="layers are sharded beside them, not alone"):
        shard_method(text_alone, torch.device("cpu"), 2)


def test_full_and_shard_helpers_leave_plain_state_as_it_is():
    net = nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = opt.state_dict()
    weights = net.state_dict()
    assert full_state(weights)["weight"] is weights["weight"]
    assert shard_optimizer_state(state, opt)["state"][0]["momentum_buffer"] is \
        state["state"][0]["momentum_buffer"]


# ---- two gloo processes against one (slow) ---------------------------------------------------

VIT = {"img_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
STEPS = 3
ARGS = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--batch-size", "16",
        "--epochs", "2", "--num-workers", "0", "--progress", "false", "--log-every", "1",
        "--mixed-precision", "no", "--seed", "0", "--max-steps", str(STEPS), "--knn-every", "0",
        "--batched-augment", "off", "--float64", "--encoder", "timm:vit_tiny_patch16_224",
        "--encoder-kwargs", json.dumps(VIT), "--save-every-steps", "0"]
MOCOV3 = [*ARGS, "--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5", "--optimizer",
          "sgd", "--lr", "0.5"]


def _test_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"_fsdp_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors"))


def _meta(out: Path) -> dict:
    return json.loads((out / "checkpoints" / f"step_{STEPS:08d}" / "meta.json").read_text())


def _losses(out: Path) -> list[float]:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


@pytest.fixture(scope="module")
def mocov3(tmp_path_factory, launch_two) -> Path:
    """The sharded runs, one launch each (fsdp_case.py): ``full``; ``mutant``; ``part`` stopped
    one step early, its copy ``planted`` with a pickle in the optimiser file, resumed (refused),
    then ``part`` resumed to the end."""
    out = tmp_path_factory.mktemp("fsdp")
    case = ["mocov3_vit_small", "MoCoV3ViTSmall", *MOCOV3]

    def launch(mode: str, folder: str, *extra: str) -> None:
        launch_two(CASE, mode, out / folder, *case, *extra, timeout=600,
                   engine=mode != "planted")  # a refused resume logs no training line

    launch("run", "full")
    launch("mutant", "mutant")
    launch("run", "part", "--max-steps", str(STEPS - 1))
    shutil.copytree(out / "part", out / "planted")
    safe = _test_module(TESTS / "engine" / "test_safe_resume.py")
    ckpt = out / "planted" / "checkpoints" / f"step_{STEPS - 1:08d}"
    safe._plant(out / "planted", str(ckpt.relative_to(out / "planted") / OPTIMIZER_FILE),
                safe._payload(out / "marker"))  # its positive control ran the payload once
    launch("planted", "planted", "--resume", "auto")
    launch("run", "part", "--resume", "auto")
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """MoCo v3 in one process, the heads' BatchNorm split in the two processes' groups."""
    from contrastive.engine import run
    from contrastive.engine.setup import reset_accelerate_state

    nodes = _test_module(TESTS / "engine" / "test_several_nodes.py")  # _split_head_bn
    mod = nodes.rx.load_recipe("mocov3_vit_small")
    out = tmp_path_factory.mktemp("fsdp_one") / "one"
    reset_accelerate_state()
    try:
        run(mod.MoCoV3ViTSmall, lambda cfg, data: nodes._split_head_bn(mod.build_method(cfg, data)),
            mod.build_pipeline, argv=[*MOCOV3, "--output-dir", str(out)], name="mocov3_vit_small")
    finally:
        reset_accelerate_state()
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_every_parameter_is_sharded_on_both_ranks(mocov3):
    from torch.distributed.tensor import Shard

    ranks = [json.loads((mocov3 / "full" / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0].keys() == ranks[1].keys() and any(".blocks.1." in k for k in ranks[0])
    assert any(k.startswith("key_net.") for k in ranks[0])  # the momentum encoder too
    for name, fact in ranks[0].items():
        assert fact["dtensor"] and fact["placements"] == [str(Shard(0))], (name, fact)
        assert fact["local"] + ranks[1][name]["local"] == fact["full"], name
    total = sum(f["full"] for f in ranks[0].values())
    for facts in ranks:
        assert 0.4 < sum(f["local"] for f in facts.values()) / total < 0.6


@pytest.mark.slow
@pytest.mark.distributed
def test_two_sharded_processes_equal_one_process(mocov3, one_process, close_f64):
    a, b = _weights(mocov3 / "full"), _weights(one_process)
    assert a.keys() == b.keys() and a["encoder.blocks.0.norm1.weight"].dtype == torch.float64
    for k in a:
        if "running_" not in k and "num_batches" not in k:  # BN statistics differ by design
            close_f64(a[k], b[k])
    assert _losses(mocov3 / "full") == pytest.approx(_losses(one_process), rel=1e-9, abs=1.01e-6)
    assert _meta(mocov3 / "full")["world_size"] == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_a_factor_two_gradient_is_caught(mocov3, one_process):
    a, b = _weights(mocov3 / "mutant"), _weights(one_process)
    gap = max(float((a[k] - b[k]).abs().max()) for k in a if k.startswith("encoder."))
    assert gap > 1e-6, gap  # the comparison's tolerance is 1e-12 + 1e-9 relative


@pytest.mark.slow
@pytest.mark.distributed
def test_a_resumed_sharded_run_equals_the_uninterrupted_one(mocov3):
    part, full = _meta(mocov3 / "part"), _meta(mocov3 / "full")
    assert part["fingerprints"] == full["fingerprints"]
    assert _losses(mocov3 / "part") == _losses(mocov3 / "full")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_planted_pickle_in_a_sharded_checkpoint_never_runs(mocov3):
    assert not (mocov3 / "marker").exists()
    for rank in range(2):
        refusal = (mocov3 / "planted" / f"rank{rank}.refusal").read_text()
        assert OPTIMIZER_FILE in refusal and "weights_only" in refusal, refusal
        assert "\n" not in refusal and "traceback" not in refusal, refusal


VIT16 = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2,
         "dynamic_img_size": True}
DINOV2 = [*ARGS[:ARGS.index("--encoder")], "--encoder-kwargs", json.dumps(VIT16), "--out-dim", "32",
          "--warmup-epochs", "0.5", "--local-crops", "2", "--local-size", "8", "--knn-every", "1",
          "--knn-max-train", "32", "--clip-grad-norm", "0.01"]


@pytest.mark.slow
@pytest.mark.distributed
def test_dinov2_sharded_equals_two_ddp_processes(tmp_path, launch_two, close_f64):
    """DINOv2 (iBOT's masked ViT, the EMA teacher a ModuleDict of parts, KoLeo, Sinkhorn-Knopp)
    with the backbone and the heads clipped apart at a norm every step exceeds (each part's norm
    over the shards), kNN at the start and the end (the encoder run alone): the sharded run ends
    where the DDP run of the same two processes ends (DDP against one process:
    tests/methods/test_ibot_distributed.py)."""
    launch_two(CASE, "run", tmp_path / "fsdp", "dinov2_cifar", "DINOv2Cifar", *DINOV2,
               timeout=600)
    recipe = TESTS.parent / "recipes" / "dinov2_cifar.py"
    launch_two(recipe, *DINOV2, "--output-dir", tmp_path / "ddp", timeout=600)
    a, b = _weights(tmp_path / "fsdp"), _weights(tmp_path / "ddp")
    assert a.keys() == b.keys() and any(k.startswith("teacher.") for k in a)
    for k in a:
        close_f64(a[k], b[k])
    facts = json.loads((tmp_path / "fsdp" / "rank1.json").read_text())
    assert all(f["dtensor"] for f in facts.values())


# ---- CLIP and SigLIP: both towers sharded, the loss's scalars whole (slow) --------------------

#: recipes/clip.py and recipes/siglip.py at a size where nothing depends on the process: a
#: depth-2 ViT (LayerNorm only) and a 2-layer BERT without dropout, in float64, with the recipes'
#: own fused AdamW (the mutant changes the gradient's direction, not its scale) and a clip at
#: 0.01 (its norm over the shards and the whole scalars together; checked by hand: it changes
#: the one-process run's weights by ~3e-3)
IMAGE_TEXT = ["--data", "shapes-captions:n=64,n_test=20,size=16,max_length=12", "--image-size",
              "16", "--batch-size", "16", "--steps", str(STEPS), "--warmup-steps", "1", "--dim",
              "8", "--layers", "2", "--hidden", "16", "--dropout", "0", "--eval-max", "8",
              "--progress", "false", "--log-every", "1", "--mixed-precision", "no",
              "--num-workers", "0", "--encoder", "timm:vit_tiny_patch16_224", "--encoder-kwargs",
              json.dumps({**VIT, "depth": 2}), "--float64", "--save-every-steps", "0",
              "--clip-grad-norm", "0.01"]
#: recipe -> its configuration class and its 0-dim parameters (kept whole on every process)
TWO_TOWERS = {"clip": ("ClipConfig", ["logit_scale"]),
              "siglip": ("SigLIPConfig", ["criterion.log_scale", "criterion.bias"])}


def _one_process_recipe(name: str, out: Path) -> Path:
    """``recipes/<name>.py`` in this process (one process, the same global batch)."""
    from contrastive.engine import run
    from contrastive.engine.setup import reset_accelerate_state

    nodes = _test_module(TESTS / "engine" / "test_several_nodes.py")
    cls, build, adapter = nodes.rx.load_recipe(name).make()
    reset_accelerate_state()
    try:
        run(cls, build, adapter=adapter, argv=[*IMAGE_TEXT, "--output-dir", str(out)], name=name)
    finally:
        reset_accelerate_state()
    return out


@pytest.fixture(scope="module")
def clip_one(tmp_path_factory) -> Path:
    return _one_process_recipe("clip", tmp_path_factory.mktemp("fsdp_clip") / "one")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", sorted(TWO_TOWERS))
def test_image_text_towers_sharded_equal_one_process(name, tmp_path, launch_two, close_f64,
                                                     clip_one):
    """Both towers' blocks (the ViT's ``blocks``, BERT's ``encoder.layer``) and every other
    part sharded; the loss's 0-dim scale (and SigLIP's bias) whole and equal on both ranks; the
    run (CLIP's gather with its gradient, SigLIP's ring exchange, both through sharded towers)
    ends where one process with the same global batch ends, in float64."""
    from torch.distributed.tensor import Shard

    config, scalars = TWO_TOWERS[name]
    launch_two(CASE, "run", tmp_path / "fsdp", name, config, *IMAGE_TEXT, timeout=600)
    one = clip_one if name == "clip" else _one_process_recipe(name, tmp_path / "one")
    ranks = [json.loads((tmp_path / "fsdp" / f"rank{r}.json").read_text()) for r in range(2)]
    for tower in ("encoder.blocks.1.", "text_encoder.model.encoder.layer.1."):
        assert any(k.startswith(tower) for k in ranks[0]), tower
    for key, fact in ranks[0].items():
        if key in scalars:
            assert not fact["dtensor"] and fact["value"] == ranks[1][key]["value"], key
        else:
            assert fact["dtensor"] and fact["placements"] == [str(Shard(0))], (key, fact)
            assert fact["local"] + ranks[1][key]["local"] == fact["full"], key
    assert sorted(k for k, f in ranks[0].items() if not f["dtensor"]) == sorted(scalars)
    a, b = _weights(tmp_path / "fsdp"), _weights(one)
    assert a.keys() == b.keys() and a[scalars[0]].dtype == torch.float64
    for k in a:
        close_f64(a[k], b[k])
    for k in scalars:  # the other rank's (rank 0 wrote the checkpoint)
        close_f64(torch.tensor(ranks[1][k]["value"], dtype=torch.float64), b[k])
    assert _losses(tmp_path / "fsdp") == pytest.approx(_losses(one), rel=1e-9, abs=1.01e-6)
    # the artefacts: the gathered weights as plain tensors (not rank 0's DTensor shards) under
    # the method's own name (not FSDP's FSDPCLIP), which contrastive-zeroshot rebuilds it by
    record = torch.load(tmp_path / "fsdp" / "clip.pt", weights_only=True)
    encoder = torch.load(tmp_path / "fsdp" / "encoder.pt", weights_only=True)
    assert record["config"]["method"] == name and encoder["method"].lower() == name
    assert record["state_dict"].keys() == a.keys()
    for k, v in [*record["state_dict"].items(),
                 *((f"encoder.{k}", v) for k, v in encoder["state_dict"].items())]:
        assert type(v) is torch.Tensor and torch.equal(v, a[k]), k


@pytest.mark.slow
@pytest.mark.distributed
def test_a_gradless_gather_under_fsdp_is_caught(tmp_path, launch_two, clip_one):
    """CLIP's gather keeping only the local rows' gradient, the towers sharded: the weights
    move far outside the comparison's tolerance (the gather's gradient is what makes 2 = 1)."""
    launch_two(CASE, "gradless", tmp_path / "gradless", "clip", "ClipConfig", *IMAGE_TEXT,
               timeout=600)
    a, b = _weights(tmp_path / "gradless"), _weights(clip_one)
    gap = max(float((a[k] - b[k]).abs().max()) for k in a if k.startswith("text_encoder."))
    assert gap > 1e-6, gap
