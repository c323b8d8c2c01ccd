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


HALF = ["--init-mean", "0.5", "0.5", "0.5", "--init-std", "0.5", "0.5", "0.5"]


def test_the_training_batch_takes_the_init_normalisation(init_file, rx):
    """With --init-mean/--init-std 0.5, the image tower trains on (pixels - 0.5) / 0.5; the
    zero-shot evaluator and the artefacts get the same pipeline."""
    from torch.utils.data import default_collate

    cls, _, adapter = rx.load_recipe("clip").make()
    cfg = parse_config(cls, [*TINY, "--init", str(init_file), *HALF])
    adapter.prepare(cfg)
    ds = adapter.train_set(cfg, accelerator=None)
    sample = default_collate([ds[0], ds[1]])
    views = adapter.batch(sample, ("input_ids",), {}, device=torch.device("cpu"), step=0,
                          micro=0, rank=0)["views"][0]
    pixels = torch.stack([ds.images[i][0][0] for i in (0, 1)]).float() / 255
    torch.testing.assert_close(views, (pixels - 0.5) / 0.5, rtol=0, atol=1e-6)
    assert adapter.handoff()["pipeline"] is adapter.pipeline
    assert (adapter.pipeline.mean, adapter.pipeline.std) == ((0.5,) * 3, (0.5,) * 3)


def test_clip_pt_records_the_init_normalisation_and_contrastive_zeroshot_uses_it(
        init_file, rx, tmp_path, monkeypatch):
    """A LiT run (--lock-image, the captions' own BERT) from --init with --init-mean/--init-std
    0.5: clip.pt and encoder.pt record 0.5/0.5; the run's zero-shot evaluator and
    ``contrastive-zeroshot`` compute the model's image features on the held-out images
    normalised with 0.5/0.5, and a clip.pt recording none falls back to [0, 1] pixels. The
    locked image tower ends as loaded, BatchNorm statistics included."""
    from contrastive.data import get_dataset
    from contrastive.eval import zeroshot
    from contrastive.records import EncoderRecord

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (images, image features) per call
    embeddings = zeroshot.clip_embeddings

    def spy(model, images, texts, tokenizer, batch_size=256):
        out = embeddings(model, images, texts, tokenizer, batch_size)
        if images.shape[0] > 1:  # not the one-image call that embeds class prompts
            seen.append((images, out[0]))
        return out

    monkeypatch.setattr(zeroshot, "clip_embeddings", spy)
    out = tmp_path / "run"
    reset_accelerate_state()
    try:
        result = rx.load_recipe("clip").main([*TINY, "--init", str(init_file), *HALF,
                                              "--lock-image", "--output-dir", str(out)])
    finally:
        reset_accelerate_state()
    assert result.status == "completed" and result.step == 2
    blob = torch.load(out / "clip.pt", weights_only=True)
    assert blob["config"]["mean"] == [0.5] * 3 and blob["config"]["std"] == [0.5] * 3
    record = EncoderRecord.load(out / "encoder.pt")
    assert record.mean == [0.5] * 3 and record.std == [0.5] * 3
    start = _file(init_file)
    assert all(torch.equal(record.state_dict[k], v) for k, v in start.items())  # LiT

    spec = blob["config"]["data"]
    pixels = zeroshot.heldout_pairs(get_dataset(spec, "test", transform=zeroshot.
                                                image_text_transform(16)), 16)[0]
    model = zeroshot.load_clip_run(out)[0]
    online = seen[-1]  # the run's evaluator at the end
    zeroshot.evaluate_run([str(out), "--n-test", "16"])
    for images, features in (online, seen[-1]):
        torch.testing.assert_close(images, (pixels - 0.5) / 0.5, rtol=0, atol=1e-6)
        with torch.no_grad():
            torch.testing.assert_close(features, model.encode_image((pixels - 0.5) / 0.5))
    del blob["config"]["mean"], blob["config"]["std"]  # as a file written before they were
    torch.save(blob, out / "clip.pt")
    zeroshot.evaluate_run([str(out), "--n-test", "16"])
    assert torch.equal(seen[-1][0], pixels)
