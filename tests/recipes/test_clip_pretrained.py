"""recipes/clip.py and recipes/siglip.py from pretrained towers (issue 49 step 4): ``--init``
loads the image tower as the method builds it; ``--lock-image`` (LiT) keeps every image-tower
tensor, BatchNorm statistics included, as loaded while the text tower and the projections train;
``--text-encoder hf:FOLDER`` trains the folder's model on the captions tokenised by its own
tokenizer, and zero-shot evaluation (in the run and ``contrastive-zeroshot``) still runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from contrastive.engine import param_groups, parse_config, reset_accelerate_state

pytest.importorskip("transformers")

MINILM = Path(__file__).resolve().parents[3] / "shared" / "data" / "text-models" / \
    "all-MiniLM-L6-v2"
TINY = ["--data", "shapes-captions:n=32,n_test=16,size=16,max_length=12", "--image-size", "16",
        "--batch-size", "16", "--steps", "2", "--warmup-steps", "1", "--dim", "8", "--layers",
        "1", "--hidden", "16", "--eval-max", "16", "--progress", "false", "--mixed-precision",
        "no", "--num-workers", "0"]


@pytest.fixture(scope="module")
def init_file(tmp_path_factory) -> Path:
    """A small_cnn state dict unlike a fresh one (other seed, BatchNorm statistics set)."""
    from safetensors.torch import save_file

    from contrastive.nn import create_encoder

    torch.manual_seed(123)
    state = create_encoder("small_cnn").state_dict()
    for key, value in state.items():
        if key.endswith("running_mean"):
            value.normal_()
        elif key.endswith("running_var"):
            value.uniform_(0.5, 2.0)
        elif key.endswith("num_batches_tracked"):
            value.fill_(7)
    path = tmp_path_factory.mktemp("init") / "small_cnn.safetensors"
    save_file(state, str(path))
    return path


def _file(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.parametrize("recipe", ["clip", "siglip"])
@pytest.mark.parametrize("lock", [False, True])
def test_init_reaches_the_image_tower_and_lock_image_freezes_it(init_file, rx, recipe, lock):
    from contrastive.data.captions import caption_tokenizer

    cls, build_method, adapter = rx.load_recipe(recipe).make()
    cfg = parse_config(cls, [*TINY, "--init", str(init_file), *(["--lock-image"] if lock else [])])
    adapter.prepare(cfg)
    tokenizer = caption_tokenizer(["a red square", "a blue circle"], 40, 8)
    with adapter.method_building(cfg):
        method = build_method(cfg, SimpleNamespace(tokenizer=tokenizer))
    loaded = method.encoder.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in _file(init_file).items())  # step 0
    assert adapter.resolved()["init"]["source"] == str(init_file)
    method.train()
    image = list(method.encoder.parameters())
    assert method.encoder.training is not lock
    assert all(p.requires_grad is not lock for p in image)
    optimised = {id(p) for g in param_groups(method, 0.1) for p in g["params"]}
    assert all((id(p) in optimised) is not lock for p in image)
    assert id(method.image_proj.weight) in optimised and id(method.text_proj.weight) in optimised


@pytest.mark.skipif(not (MINILM / "model.safetensors").is_file(),
                    reason=f"the MiniLM folder is absent ({MINILM})")
def test_lit_with_an_hf_text_tower_trains_on_shapes_captions(init_file, rx, tmp_path):
    from contrastive.data.captions import encode_fixed
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.eval.zeroshot import evaluate_run

    out = tmp_path / "run"
    reset_accelerate_state()
    try:
        result = rx.load_recipe("clip").main([
            *TINY, "--init", str(init_file), "--lock-image", "--text-encoder", f"hf:{MINILM}",
            "--output-dir", str(out)])
    finally:
        reset_accelerate_state()
    assert result.status == "completed" and result.step == 2
    state = torch.load(out / "clip.pt", weights_only=True)["state_dict"]
    image = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    start = _file(init_file)
    assert image.keys() == start.keys()
    assert all(torch.equal(image[k], start[k]) for k in start)  # BN statistics included
    text = _file(MINILM / "model.safetensors")
    moved = [k for k in text if k != "embeddings.position_ids"
             and not torch.equal(state[f"text_encoder.model.{k}"], text[k])]
    assert len(moved) > len(text) // 2  # the text tower trained
    ours, folder = load_tokenizer(out / "tokenizer"), load_tokenizer(MINILM)
    assert ours.vocab_size == folder.vocab_size  # the captions went through MiniLM's tokenizer
    assert torch.equal(encode_fixed(ours, ["a red square"])[0],
                       encode_fixed(folder, ["a red square"])[0])
    end = [r for r in rx.read_metrics(out) if r.get("zeroshot_when") == "end"]
    assert len(end) == 1 and "zeroshot_top1" in end[0]
    recorded = json.loads((out / "config.json").read_text())["resolved"]["init"]
    assert recorded["sha256"] == hashlib.sha256(init_file.read_bytes()).hexdigest()
    again = evaluate_run([str(out), "--n-test", "16"])
    assert again["top1"] == pytest.approx(end[0]["zeroshot_top1"], abs=1e-3)


@pytest.mark.skipif(not (MINILM / "model.safetensors").is_file(),
                    reason=f"the MiniLM folder is absent ({MINILM})")
def test_an_hf_text_tower_tokenises_a_caption_folder_with_its_tokenizer(rx, tmp_path):
    from PIL import Image

    from contrastive.data.captions import encode_fixed
    from contrastive.data.tokenizer import load_tokenizer

    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(root / "0.png")
    (root / "captions.tsv").write_text("image\tcaption\n0.png\ta red square\n")
    cls, _, adapter = rx.load_recipe("siglip").make()
    cfg = parse_config(cls, [*TINY, "--data", f"captions:{root},max_length=10",
                             "--text-encoder", f"hf:{MINILM}"])
    adapter.prepare(cfg)
    ds = adapter.train_set(cfg, accelerator=None)
    want = encode_fixed(load_tokenizer(MINILM, max_length=10), ["a red square"])[0][0]
    assert torch.equal(ds[0][2]["input_ids"], want)
    assert adapter.resolved()["model"]["text_encoder"] == f"hf:{MINILM}"
