"""contrastive-plot attention | mae | retrieval: the attention maps are the last block's softmax
(checked against timm's own and a direct q k^T), the MAE picture hides exactly the masked
patches and keeps the visible ones, the retrieval grid shows the brute-force neighbours, the
PNGs have the grid's pixel size, bad input is one line (a tiny ViT, a 2-step MAE run on
generated images, a small_cnn embed folder)."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
pytest.importorskip("timm")

from contrastive.eval import pictures  # noqa: E402
from contrastive.eval.cli import plot_main  # noqa: E402
from contrastive.nn import create_encoder  # noqa: E402
from contrastive.records import EncoderRecord  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VIT = "timm:vit_tiny_patch16_224"
VIT_KW = {"img_size": 32, "patch_size": 8, "embed_dim": 24, "depth": 2, "num_heads": 3}
MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]


def _png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


def _grid_px(rows: int, cols: int, panel: int) -> tuple[int, int]:
    return cols * panel, rows * panel + pictures.HEADER_PX


def _images(folder: Path, n: int, size: int, seed: int = 0) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        paths.append(str(folder / f"im{i:02d}.png"))
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def _one_line_exit(capsys, argv: list[str], *words: str) -> None:
    with pytest.raises(SystemExit) as e:
        plot_main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


# ---- attention -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return create_encoder(VIT, **VIT_KW).eval()


def test_attention_is_the_last_blocks_softmax(vit):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    attn = vit.blocks[-1].attn
    seen: dict[str, torch.Tensor] = {}
    hooks = [attn.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0])),
             attn.attn_drop.register_forward_hook(lambda m, a, o: seen.setdefault("timm", a[0]))]
    fused = attn.fused_attn
    attn.fused_attn = False  # timm's own softmax, through attn_drop
    try:
        with torch.no_grad():
            vit(x)
    finally:
        attn.fused_attn = fused
        for h in hooks:
            h.remove()
    full = pictures.last_self_attention(vit, x)  # the fused path: recomputed by our hook
    torch.testing.assert_close(full, seen["timm"], atol=1e-6, rtol=1e-5)
    # directly from q, k: softmax(q k^T / sqrt(d)) of the block's input
    d = 24 // 3
    w, b = attn.qkv.weight, attn.qkv.bias
    q = (seen["x"] @ w[:24].T + b[:24]).reshape(2, 17, 3, d).transpose(1, 2)
    k = (seen["x"] @ w[24:48].T + b[24:48]).reshape(2, 17, 3, d).transpose(1, 2)
    direct = (q @ k.transpose(-2, -1) / d ** 0.5).softmax(-1)
    torch.testing.assert_close(full, direct, atol=1e-6, rtol=1e-5)
    maps = pictures.cls_attention(vit, x)
    assert maps.shape == (2, 3, 4, 4)
    torch.testing.assert_close(maps.sum(dim=(-2, -1)), torch.ones(2, 3))
    cls_row = direct[:, :, 0, 1:]
    torch.testing.assert_close(maps.flatten(-2), cls_row / cls_row.sum(-1, keepdim=True))


def test_mass_mask_keeps_the_smallest_top_set():
    maps = torch.rand(3, 5, 5, generator=torch.Generator().manual_seed(0))
    keep = pictures.mass_mask(maps, 0.6)
    for m, k in zip(maps, keep):
        p = m / m.sum()
        assert p[k].sum() >= 0.6 and p[k].min() >= p[~k].max()
        assert p[k].sum() - p[k].min() < 0.6  # without its smallest member it holds too little


def test_attention_png_and_a_resnet_refused(vit, tmp_path, capsys):
    EncoderRecord.from_module(vit, VIT, encoder_kwargs=VIT_KW, mean=MEAN, std=STD,
                              image_size=32).save(tmp_path / "encoder.pt")
    images = _images(tmp_path / "img", 2, 40)
    out = tmp_path / "attention.png"
    assert plot_main(["attention", "--checkpoint", str(tmp_path / "encoder.pt"), "--images",
                      *images, "--out", str(out)]) == 0
    assert _png_size(out) == _grid_px(2, 1 + 1 + 3, 128)  # image, mean, 3 heads
    _one_line_exit(capsys, ["attention", "--checkpoint", str(tmp_path / "encoder.pt"), "--images",
                            *images, "--image-size", "48"], "--image-size")
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict()},
               tmp_path / "cnn.pt")
    _one_line_exit(capsys, ["attention", "--checkpoint", str(tmp_path / "cnn.pt"), "--images",
                            *images], "not a ViT", "small_cnn")


# ---- MAE -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mae_run(tmp_path_factory):
    """Two steps of recipes/mae_cifar.py on generated 16-px images (a 1-block ViT)."""
    from contrastive.engine import reset_accelerate_state, run

    out = tmp_path_factory.mktemp("mae") / "run"
    recipe = runpy.run_path(str(ROOT / "recipes" / "mae_cifar.py"))
    vit16 = json.dumps({"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2})
    reset_accelerate_state()
    try:
        run(recipe["MAECifar"], recipe["build_method"], recipe["build_pipeline"], name="mae_cifar", argv=[
            "--data", "shapes:n=16,n_test=8,size=16", "--image-size", "16", "--encoder-kwargs", vit16,
            "--decoder-dim", "8", "--decoder-depth", "1", "--decoder-heads", "2", "--batch-size", "8",
            "--max-steps", "2", "--num-workers", "0", "--progress", "false", "--mixed-precision", "no",
            "--knn-every", "0", "--output-dir", str(out)])
    finally:
        reset_accelerate_state()
    return out


def test_mae_picture_hides_the_masked_patches(mae_run):
    method, run = pictures.load_mae_run(mae_run)
    assert run["image_size"] == 16 and run["step"] == 2 and method.decoder.embed.out_features == 8
    from contrastive.eval.runner import eval_transform

    x = pictures.load_images(data=run["data"], count=3,
                             transform=eval_transform(16, run["mean"], run["std"]))
    rec = pictures.mae_reconstruct(method, x, mean=run["mean"], std=run["std"], seed=1)
    assert rec.norm_pix and rec.mask.shape == (3, 16) and rec.mask.sum(1).tolist() == [12] * 3
    torch.testing.assert_close(rec.original, pictures.unnormalise(x, run["mean"], run["std"]))
    removed = rec.mask.reshape(3, 4, 4).repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None]
    removed = removed.expand_as(rec.original)
    assert torch.equal(rec.masked[~removed], rec.original[~removed])
    assert (rec.masked[removed] == 0.5).all()
    assert torch.equal(rec.pasted[~removed], rec.original[~removed])
    assert torch.equal(rec.pasted[removed], rec.reconstruction[removed])
    assert not torch.equal(rec.reconstruction[removed], rec.original[removed])
    out = pictures.plot_mae(rec, mae_run / "x.png")
    assert _png_size(out) == _grid_px(3, 3, 128)


def test_mae_cli_and_its_bad_inputs(mae_run, tmp_path, capsys):
    assert plot_main(["mae", str(mae_run), "--num-images", "2"]) == 0
    assert _png_size(mae_run / "mae.png") == _grid_px(2, 3, 128)
    # a run of another method
    other = tmp_path / "other"
    shutil.copytree(mae_run / "checkpoints", other / "checkpoints")
    meta_path = next((other / "checkpoints").glob("step_*")) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["signature"]["method"] = "SimCLR"
    meta_path.write_text(json.dumps(meta))
    _one_line_exit(capsys, ["mae", str(other)], "SimCLR", "not MAE")
    # only an encoder.pt: no decoder
    (tmp_path / "enc").mkdir()
    shutil.copy(mae_run / "encoder.pt", tmp_path / "enc" / "encoder.pt")
    _one_line_exit(capsys, ["mae", str(tmp_path / "enc")], "decoder")


# ---- retrieval -------------------------------------------------------------------------------

def test_retrieval_grid_shows_the_brute_force_neighbours(tmp_path, capsys):
    from contrastive.eval.embed import main as embed_main

    _images(tmp_path / "images", 9, 16, seed=3)
    torch.manual_seed(0)
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict(),
                "image_size": 16, "mean": MEAN, "std": STD}, tmp_path / "encoder.pt")
    emb = tmp_path / "emb"
    assert embed_main(["--checkpoint", str(tmp_path / "encoder.pt"), "--data", str(tmp_path / "images"),
                       "--out", str(emb), "--num-workers", "0", "--no-progress"]) == 0
    manifest = json.loads((emb / "manifest.json").read_text())
    vecs = np.concatenate([np.load(emb / s["vectors"]) for s in manifest["shards"]])
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    out, found = pictures.plot_retrieval(emb, tmp_path / "grid.png", rows=[0, 4], top_k=3)
    assert _png_size(out) == _grid_px(2, 4, 112)
    for f in found:
        sims = unit @ unit[f["row"]]
        sims[f["row"]] = -np.inf
        assert [r for r, _ in f["neighbours"]] == list(np.argsort(-sims)[:3])
        np.testing.assert_allclose([s for _, s in f["neighbours"]], np.sort(sims)[::-1][:3], atol=1e-5)
    # an image file as the query: embedded by the folder's encoder, itself its best match
    _, found = pictures.retrieval_neighbours(emb, queries=[str(tmp_path / "images" / "im02.png")], top_k=2)
    assert found[0]["neighbours"][0][0] == 2 and found[0]["neighbours"][0][1] == pytest.approx(1, abs=1e-5)
    assert plot_main(["retrieval", str(emb), "--num-queries", "3", "--top-k", "2"]) == 0
    assert _png_size(emb / "retrieval.png") == _grid_px(3, 3, 112)
    _one_line_exit(capsys, ["retrieval", str(tmp_path / "nowhere")], "no such contrastive-embed folder")
