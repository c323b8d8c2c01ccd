"""Image-text data (contrastive.data.captions): the caption folder (TSV and JSONL, several
captions per image), image-text shards (.jpg + .txt), shapes captions that say what was drawn,
the seeded caption choice, the deterministic tokenizer, and clear errors."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.data.captions import (
    ImageTextDataset,
    caption_folder,
    caption_tokenizer,
    encode_fixed,
    read_captions,
    shapes_captions,
    shard_captions,
)
from contrastive.data.generated import (
    COLOUR_NAMES,
    SHAPE_CLASSES,
    generate_shapes,
    shape_attributes,
    shape_captions,
)
from contrastive.data.shards import ShardDataset
from contrastive.engine.loader import SeededDataset

pytest.importorskip("tokenizers")

WORDS = ["a red cat", "a cat on a mat", "the blue dog", "a dog running", "one green emu"]


@pytest.fixture(scope="module")
def tok():
    return caption_tokenizer(WORDS + shape_captions(50), vocab_size=120, max_length=12)


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((10, 12, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _folder(root: Path) -> Path:
    (root / "img").mkdir(parents=True)
    for i, v in enumerate((10, 120, 240)):
        (root / "img" / f"{i}.png").write_bytes(_png(v))
    return root


def test_tsv_with_several_rows_per_image(tmp_path, tok):
    root = _folder(tmp_path)
    (root / "captions.tsv").write_text(
        "filepath\ttitle\nimg/0.png\ta red cat\nimg/1.png\tthe blue dog\nimg/0.png\ta cat on a mat\n"
        "img/2.png\tone green emu\n\n")
    assert read_captions(root / "captions.tsv") == {
        "img/0.png": ["a red cat", "a cat on a mat"], "img/1.png": ["the blue dog"],
        "img/2.png": ["one green emu"]}
    ds = caption_folder(root, tok)
    assert len(ds) == 3 and ds.captions_of(0) == ["a red cat", "a cat on a mat"]
    img, label, tokens = ds[1]
    assert np.asarray(img)[0, 0].tolist() == [120, 120, 120] and label == -1
    assert tokens["input_ids"].shape == tokens["attention_mask"].shape == (12,)
    assert tok.decode(tokens["input_ids"].tolist()) == "the blue dog"


def test_jsonl_with_caption_lists(tmp_path, tok):
    root = _folder(tmp_path)
    lines = [{"image": "img/2.png", "captions": ["one green emu", "a dog running"]},
             {"image": "img/0.png", "caption": "a red cat"}]
    (root / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    ds = caption_folder(root, tok)
    assert [ds.captions_of(i) for i in range(2)] == [["one green emu", "a dog running"],
                                                      ["a red cat"]]


def test_caption_files_with_problems_fail_clearly(tmp_path, tok):
    root = _folder(tmp_path)
    (root / "a.tsv").write_text("img/0.png\ta red cat\n")
    with pytest.raises(ValueError, match="header naming the image column"):
        read_captions(root / "a.tsv")
    (root / "b.jsonl").write_text('{"image": "img/0.png"}\n')
    with pytest.raises(ValueError, match="b.jsonl:1.*'caption' or 'captions'"):
        read_captions(root / "b.jsonl")
    (root / "c.tsv").write_text("image\tcaption\nimg/9.png\ta cat\n")
    with pytest.raises(FileNotFoundError, match="img/9.png"):
        caption_folder(root, tok, captions=root / "c.tsv")
    with pytest.raises(FileNotFoundError, match="captions.tsv or captions.jsonl"):
        caption_folder(root, tok)
    with pytest.raises(ValueError, match="one list per image"):
        ImageTextDataset([(0, 0)] * 3, [["a"]] * 2, tok)


def test_the_caption_is_drawn_from_the_sample_seed():
    tok = caption_tokenizer(shape_captions(50), vocab_size=120, max_length=32)
    ds = SeededDataset(shapes_captions(tok, n=10), seed=3)
    picks = {tok.decode(ds[(e, 4)][2]["input_ids"].tolist()) for e in range(30)}
    assert len(picks) >= 3  # several of the five phrasings over epochs ...
    assert picks <= set(shape_captions(10)[4])
    a, b = ds[(5, 4)], ds[(5, 4)]  # ... and the same one for the same (seed, epoch, index)
    assert torch.equal(a[2]["input_ids"], b[2]["input_ids"])


def test_tokenizer_is_deterministic_and_pads_to_a_fixed_length(tok):
    again = caption_tokenizer(WORDS + shape_captions(50), vocab_size=120, max_length=12)
    ids, mask = encode_fixed(tok, ["a red cat", "a small red disc on a grey background here"])
    ids2, _ = encode_fixed(again, ["a red cat", "a small red disc on a grey background here"])
    assert torch.equal(ids, ids2) and ids.shape == (2, 12)
    short = tok(["a red cat"])["input_ids"][0]  # [CLS] a red cat [SEP], unpadded
    k = len(short)
    assert k < 12 and torch.equal(ids[0, :k], short) and (ids[0, k:] == tok.pad_id).all()
    assert mask[0].tolist() == [1] * k + [0] * (12 - k) and mask[1].all()  # long: truncated


def test_shapes_captions_say_what_was_drawn():
    n = 40
    images, labels = generate_shapes(n, 32, seed=0, split="test")
    attrs = shape_attributes(n, seed=0, split="test")
    names = list(COLOUR_NAMES)
    table = torch.tensor([COLOUR_NAMES[k] for k in names])
    for i in range(n):
        a = attrs[i]
        assert a["shape"] == SHAPE_CLASSES[int(labels[i])]
        img = images[i].float() / 255
        # the background colour is the corner pixel's; the shape's is the other colour drawn
        corner = img[:, 0, 0]
        assert names[int(torch.cdist(corner[None], table).argmin())] == a["background"]
        far = (img - corner.view(3, 1, 1)).norm(dim=0)
        ys, xs = torch.nonzero(far > 0.3, as_tuple=True)
        fg = img[:, ys, xs].mean(dim=1)  # mostly pure foreground pixels (soft edges are few)
        nearest = torch.cdist(fg[None], table)[0]
        assert a["colour"] in [names[j] for j in nearest.argsort()[:2].tolist()], (i, a)
        # the position words follow the shape's centre of mass (thirds of the frame, margin aside)
        cy, cx = ys.float().mean() / 32, xs.float().mean() / 32
        pos = a["position"]
        if "top" in pos:
            assert cy < 0.5
        if "bottom" in pos:
            assert cy > 0.5
        if "left" in pos:
            assert cx < 0.5
        if "right" in pos:
            assert cx > 0.5
    caps = shape_captions(n, seed=0, split="test")
    assert len(caps[0]) == 5 and all(attrs[i]["shape"] in c for i in range(n) for c in caps[i])
    assert shape_captions(5, seed=0, split="test", start=3) == caps[3:8]


def test_shapes_images_unchanged_by_captions(tok):
    ds = shapes_captions(tok, n=20, seed=1)
    images, labels = generate_shapes(20, 32, seed=1)
    assert torch.equal(ds[7][0], images[7]) and ds[7][1] == int(labels[7])
    assert ds.targets == labels.tolist() and ds.classes == list(SHAPE_CLASSES)


def _shard(path: Path, with_text=(True, True, True), bad_text=False) -> Path:
    with tarfile.open(path, "w") as tf:
        for i, v in enumerate((10, 120, 240)):
            members = [(f"{i:04d}.png", _png(v)), (f"{i:04d}.cls", str(i).encode())]
            if with_text[i]:
                word = ("cat", "dog", "emu")[i]
                text = b"\xff\xfe" if bad_text else f"{word} one\n\n{word} two\n".encode()
                members.append((f"{i:04d}.txt", text))
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_shards_read_text_members(tmp_path, tok):
    shard = _shard(tmp_path / "a.tar")
    plain = ShardDataset([shard])
    assert len(plain[0]) == 2  # image-only readers are unchanged
    ds = shard_captions([shard], tok)
    assert ds.captions_of(2) == ["emu one", "emu two"]
    img, label, tokens = ds[1]
    assert label == 1 and np.asarray(img)[0, 0, 0] == 120
    assert tok.decode(tokens["input_ids"].tolist()) in ("dog one", "dog two")


def test_shards_without_text_or_with_bad_text_fail_clearly(tmp_path, tok):
    with pytest.raises(ValueError, match="1 sample.*no .txt member.*0001"):
        shard_captions([_shard(tmp_path / "a.tar", with_text=(True, False, True))], tok)
    ds = shard_captions([_shard(tmp_path / "b.tar", bad_text=True)], tok)
    with pytest.raises(ValueError, match="not UTF-8"):
        ds[0]


def test_data_specs_build_image_text_sets(tmp_path):
    from contrastive.data import get_dataset, has_split

    root = _folder(tmp_path)
    (root / "captions.tsv").write_text("image\tcaption\nimg/0.png\ta red cat\nimg/1.png\ta dog\n"
                                       "img/2.png\tone green emu\n")
    ds = get_dataset(f"captions:{root},max_length=8")
    assert isinstance(ds, ImageTextDataset) and len(ds) == 3 and not has_split(f"captions:{root}",
                                                                                "test")
    assert ds.tokenizer.decode(ds[2][2]["input_ids"].tolist()) == "one green emu"
    assert ds[2][2]["input_ids"].shape == (8,)
    train = get_dataset("shapes-captions:n=30,n_test=10,size=16")
    test = get_dataset("shapes-captions:n=30,n_test=10,size=16", "test")
    assert (len(train), len(test)) == (30, 10) and train.extra_keys == ("input_ids", "attention_mask")
    assert train.tokenizer.tokenizer.get_vocab() == test.tokenizer.tokenizer.get_vocab()
    assert test.captions_of(3) == shape_captions(4, split="test")[3]


def test_wds_captions_spec(tmp_path, tok):
    from contrastive.data import get_dataset

    _shard(tmp_path / "train-0.tar")
    ds = get_dataset(f"wds-captions:{tmp_path}/train-0.tar,max_length=8")
    assert len(ds) == 3 and ds.extra_keys == ("input_ids", "attention_mask")
    assert ds.tokenizer.decode(ds[0][2]["input_ids"].tolist()) in ("cat one", "cat two")
    tok.save(tmp_path / "tok")  # or a saved tokenizer
    ds = get_dataset(f"wds-captions:{tmp_path}/train-0.tar,tokenizer={tmp_path / 'tok'}")
    assert ds.tokenizer.vocab_size == tok.vocab_size
