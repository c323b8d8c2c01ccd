"""``contrastive-export --format onnx``: ONNX Runtime equals torch (1e-4, float32) on every
encoder family at two batch sizes, the input recorded in the metadata, bad input in one line.

The default run exports one model (a small_cnn run: a few seconds, mostly the exporter's own
cost); the other families, text included, are under ``slow``. Each test checks the file
itself, at batch sizes the command did not check (3 and 5, and two sequence lengths for text),
against the torch module built independently from the same weights.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import onnxruntime as ort  # noqa: E402

from contrastive.eval.cli import export_main  # noqa: E402
from contrastive.nn import create_encoder  # noqa: E402
from contrastive.records import EncoderRecord  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
LITE0 = SHARED / "image-models" / "efficientnet_lite0" / "model.safetensors"
MINILM = SHARED / "text-models" / "all-MiniLM-L6-v2"
ATOL = 1e-4
SENTENCES = ["the cat sat on the mat", "a dog runs in the park with a ball",
             "contrastive models learn from pairs", "hello world"] * 3


def run_export(argv: list[str], capsys) -> str:
    assert export_main(["--format", "onnx", *argv]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    diff = float(line.rsplit("largest absolute difference ", 1)[1])
    assert diff <= ATOL, line
    return line


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def metadata(path: Path) -> dict[str, str]:
    return {k.removeprefix("contrastive."): v
            for k, v in session(path).get_modelmeta().custom_metadata_map.items()}


@torch.no_grad()
def assert_images_match(path: Path, module, size: int, mean=None, std=None) -> None:
    """The file at batch sizes 3 and 5 equals ``module`` on normalised inputs (``mean`` /
    ``std`` given: the graph takes [0, 1] pixels and normalises them itself)."""
    sess = session(path)
    assert sess.get_inputs()[0].shape == ["batch", 3, size, size]
    g = torch.Generator().manual_seed(1)
    for n in (3, 5):
        pixels = torch.rand(n, 3, size, size, generator=g)
        x = pixels if mean is None else (pixels - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        theirs = sess.run(["features"], {"image": (pixels if mean is not None else x).numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(theirs), module.eval()(x), atol=ATOL, rtol=0)


@torch.no_grad()
def assert_text_matches(path: Path, embed, vocab_size: int) -> None:
    """The file equals ``embed(ids, mask)`` at batch 3 x 9 tokens and 5 x 17, with padding."""
    sess = session(path)
    assert [i.shape for i in sess.get_inputs()] == [["batch", "sequence"]] * 2
    g = torch.Generator().manual_seed(1)
    for n, length in ((3, 9), (5, 17)):
        ids = torch.randint(5, vocab_size, (n, length), generator=g)
        mask = torch.ones_like(ids)
        mask[1:, length // 2:] = 0
        theirs = sess.run(["features"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(theirs), embed(ids, mask), atol=ATOL, rtol=0)


def image_run(folder: Path, encoder: str, *, seed: int = 0, data: str = "shapes:n=20,size=32",
              **kwargs) -> torch.nn.Module:
    """A run folder: encoder.pt (normalisation 0.5 / 0.25, 32 px) and config.json naming its data."""
    torch.manual_seed(seed)
    module = create_encoder(encoder, **kwargs).eval()
    folder.mkdir(parents=True, exist_ok=True)
    EncoderRecord.from_module(module, encoder, encoder_kwargs=kwargs, mean=(0.5,) * 3,
                              std=(0.25,) * 3, image_size=32).save(folder / "encoder.pt")
    (folder / "config.json").write_text(json.dumps({"encoder": encoder, "data": data}))
    return module


@pytest.fixture(scope="module")
def small_cnn_export(tmp_path_factory):
    run = tmp_path_factory.mktemp("small_cnn_run")
    module = image_run(run, "small_cnn")
    out = run / "small_cnn.onnx"
    assert export_main(["--format", "onnx", "--checkpoint", str(run), "--out", str(out)]) == 0
    return out, module


def test_small_cnn_run_checked_on_its_data_with_its_input_recorded(small_cnn_export):
    out, module = small_cnn_export
    meta = metadata(out)
    assert json.loads(meta["mean"]) == [0.5] * 3 and json.loads(meta["std"]) == [0.25] * 3
    assert (meta["image_size"], meta["normalisation"], meta["encoder"]) == ("32", "by the caller", "small_cnn")
    assert_images_match(out, module, 32)


def test_a_mismatch_removes_the_file_in_one_line(small_cnn_export, tmp_path):
    """The check compares values: a torch output moved by 1e-3 fails it and the file goes."""
    from contrastive.eval.export_onnx import OnnxMismatchError, check_onnx

    out, module = small_cnn_export
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(out.read_bytes())
    x = torch.randn(4, 3, 32, 32)
    assert check_onnx(copy, module, [(x,), (x[:1],)], ["image"]) <= ATOL
    with pytest.raises(OnnxMismatchError, match=r"differ from torch's by 0\.001.*removed") as e:
        check_onnx(copy, lambda t: module(t) + 1e-3, [(x,)], ["image"])
    assert "\n" not in str(e.value) and not copy.exists()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A 2-layer BERT folder with its tokenizer and simcse.json (mean pooling)."""
    from contrastive.data.tokenizer import train_wordpiece

    folder = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = train_wordpiece(SENTENCES, vocab_size=120)
    torch.manual_seed(0)
    encoder = create_encoder("bert", num_layers=2, hidden_size=32, num_heads=2,
                             vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    encoder.model.save_pretrained(str(folder))
    tokenizer.save(folder)
    (folder / "simcse.json").write_text(json.dumps({"pooling": "mean"}))
    return folder, encoder.eval(), tokenizer.vocab_size


def export_text(folder: Path, tmp_path: Path, capsys, *extra: str) -> Path:
    out = tmp_path / "text.onnx"
    line = run_export(["--checkpoint", str(folder), "--out", str(out), *extra], capsys)
    assert "fixed English sentences" in line or "--check-data" in extra
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
def test_tiny_bert_each_pooling(tiny_bert, tmp_path, capsys, pooling):
    """mean: the folder's own (simcse.json), checked on fixed sentences; cls, pooler: --pooling,
    checked on a file of sentences."""
    from contrastive.nn.text_encoders import TextEncoder

    folder, encoder, vocab = tiny_bert
    extra: list[str] = []
    if pooling != "mean":
        sentences = tmp_path / "sentences.txt"
        sentences.write_text("\n".join(SENTENCES[:5]) + "\n")
        extra = ["--pooling", pooling, "--check-data", str(sentences)]
    out = export_text(folder, tmp_path, capsys, *extra)
    meta = metadata(out)
    assert (meta["pooling"], meta["max_sequence"]) == (pooling, "64")
    assert_text_matches(out, TextEncoder(encoder.model, pooling=pooling).eval(), vocab)


@pytest.mark.slow
@pytest.mark.parametrize("encoder,kwargs", [
    ("cifar_resnet18", {}),
    ("timm:resnet18", {}),
    ("timm:vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}),
    ("torchvision:resnet18", {}),
])
def test_image_families(tmp_path, capsys, encoder, kwargs):
    module = image_run(tmp_path / "run", encoder, **kwargs)
    out = tmp_path / "model.onnx"
    run_export(["--checkpoint", str(tmp_path / "run"), "--out", str(out)], capsys)
    assert_images_match(out, module, 32)


@pytest.mark.slow
def test_folded_normalisation_takes_pixels_in_0_1(tmp_path, capsys):
    module = image_run(tmp_path / "run", "small_cnn", seed=3)
    out = tmp_path / "folded.onnx"
    run_export(["--checkpoint", str(tmp_path / "run"), "--out", str(out), "--fold-normalisation"], capsys)
    assert metadata(out)["normalisation"] == "in the graph"
    assert_images_match(out, module, 32, mean=(0.5,) * 3, std=(0.25,) * 3)


def cifar_jpegs(root: Path, per_split: int = 1) -> Path:
    """A few real CIFAR-10 JPEGs (one per class and split) from ../shared/data's tar."""
    tar_path = SHARED / "cifar10-jpeg.tar"
    if not tar_path.is_file():
        pytest.skip(f"the CIFAR-10 JPEG copy is not at {tar_path} (../shared/data)")
    seen: dict[tuple[str, str], int] = {}
    with tarfile.open(tar_path) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 3 or parts[-3] not in ("train", "test"):
                continue
            key = (parts[-3], parts[-2])
            if seen.get(key, 0) < per_split:
                seen[key] = seen.get(key, 0) + 1
                dest = root / parts[-3] / parts[-2] / parts[-1]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tar.extractfile(member).read())
            if len(seen) == 20 and all(v >= per_split for v in seen.values()):
                break
    return root


@pytest.mark.slow
def test_real_efficientnet_on_real_images(tmp_path, capsys):
    """The pretrained EfficientNet-Lite0 of ../shared/data (mean = std = 0.5) on CIFAR JPEGs."""
    if not LITE0.is_file():
        pytest.skip(f"the pretrained EfficientNet-Lite0 file is not at {LITE0} (../shared/data)")
    from safetensors.torch import load_file

    data = cifar_jpegs(tmp_path / "cifar")
    out = tmp_path / "lite0.onnx"
    line = run_export(["--checkpoint", str(LITE0), "--encoder", "timm:efficientnet_lite0",
                       "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5",
                       "--image-size", "64", "--check-data", str(data), "--out", str(out)], capsys)
    assert f"images of {data}" in line
    module = create_encoder("timm:efficientnet_lite0")
    module.load_state_dict(load_file(str(LITE0)), strict=False)
    assert_images_match(out, module, 64)


@pytest.mark.slow
def test_minilm_sentence_transformers_folder(tmp_path, capsys):
    """all-MiniLM-L6-v2: its own pipeline (mean pooling, Normalize) as sentence-transformers has it."""
    if not (MINILM / "model.safetensors").is_file():
        pytest.skip(f"the MiniLM folder is not at {MINILM} (../shared/data)")
    import torch.nn.functional as F

    from contrastive.nn.text_encoders import load_text_encoder

    out = export_text(MINILM, tmp_path, capsys)
    assert metadata(out)["pooling"] == "mean+normalize"
    encoder = load_text_encoder(MINILM, pooling="mean").eval()
    assert_text_matches(out, lambda ids, mask: F.normalize(encoder(ids, mask), dim=-1), 30522)


def one_line_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        export_main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line(tmp_path, capsys):
    folder = tmp_path / "text"  # a Hugging Face folder as far as the refusals look
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    run = tmp_path / "run"
    image_run(run, "small_cnn")
    out = ["--out", str(tmp_path / "x.onnx")]
    assert "not found" in one_line_error(["--format", "onnx", "--checkpoint", str(tmp_path / "nope"), *out], capsys)
    assert "text model" in one_line_error(["--format", "onnx", "--checkpoint", str(folder),
                                           "--encoder", "cifar_resnet18", *out], capsys)
    assert "text model" in one_line_error(["--format", "onnx", "--checkpoint", str(folder),
                                           "--image-size", "32", *out], capsys)
    assert "one sentence a line" in one_line_error(["--format", "onnx", "--checkpoint", str(folder),
                                                    "--check-data", str(tmp_path), *out], capsys)
    assert "--pooling applies to text" in one_line_error(["--format", "onnx", "--checkpoint", str(run),
                                                          "--pooling", "cls", *out], capsys)
    assert ".onnx" in one_line_error(["--format", "onnx", "--checkpoint", str(run),
                                      "--out", str(tmp_path / "x.pth")], capsys)
    assert "only --format onnx takes --image-size" in one_line_error(["--format", "timm", "--checkpoint", str(run),
                                                   "--image-size", "32", *out], capsys)
    assert not list(tmp_path.glob("*.onnx"))


@pytest.mark.parametrize("fmt", ["timm", "torchvision"])
def test_library_formats_refuse_our_encoders_pointing_to_onnx(tmp_path, capsys, fmt):
    image_run(tmp_path / "run", "cifar_resnet18")
    err = one_line_error(["--format", fmt, "--checkpoint", str(tmp_path / "run"),
                          "--out", str(tmp_path / "r.pth")], capsys)
    assert "no counterpart" in err and "--format onnx" in err


def test_download_false_only_where_the_data_set_takes_it(tmp_path, monkeypatch):
    """The check never downloads, and never turns a folder into a spec naming no data set (a
    folder path with ``:download=false`` appended named no folder: the check fell back to
    random pixels)."""
    from contrastive.eval.export_onnx import _without_download

    (tmp_path / "my_images" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert _without_download("my_images") == "my_images"
    assert _without_download(str(tmp_path / "my_images")) == str(tmp_path / "my_images")
    assert _without_download("shapes:size=24") == "shapes:size=24"
    assert _without_download("cifar10") == "cifar10:download=false"
    assert _without_download("cifar10:/data") == "cifar10:/data,download=false"
