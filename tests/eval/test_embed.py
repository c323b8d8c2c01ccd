"""contrastive-embed: shards resumed byte for byte, search = brute force, the --query JSON and
--duplicates CSV formats, one-line errors (small_cnn on generated images, a tiny random BERT)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from contrastive.eval.embed import main
from contrastive.eval.embed_store import MANIFEST, build_index, index_rule, near_duplicates, search
from contrastive.nn import create_encoder

N_IMAGES = 11  # + 1 planted copy of image 3


@pytest.fixture(scope="module")
def image_job(tmp_path_factory):
    """An image folder with one exact duplicate, and a small_cnn encoder.pt recording its normalisation."""
    root = tmp_path_factory.mktemp("embed")
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "images"
    folder.mkdir()
    for i in range(N_IMAGES):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"im{i:02d}.png")
    shutil.copy(folder / "im03.png", folder / "zz_copy_of_03.png")
    torch.manual_seed(0)
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict(),
                "image_size": 16, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}, root / "encoder.pt")
    return root


def _embed(root: Path, out: str, *extra: str) -> Path:
    assert main(["--checkpoint", str(root / "encoder.pt"), "--data", str(root / "images"), "--out",
                 str(root / out), "--shard-size", "5", "--num-workers", "0", "--no-progress", *extra]) == 0
    return root / out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*"))}


def _vectors(folder: Path) -> tuple[np.ndarray, list[str]]:
    manifest = json.loads((folder / MANIFEST).read_text())
    vecs = np.concatenate([np.load(folder / s["vectors"]) for s in manifest["shards"]])
    ids = sum((json.loads((folder / s["ids"]).read_text()) for s in manifest["shards"]), [])
    return vecs, ids


def test_resumed_job_writes_the_same_bytes(image_job):
    whole = _embed(image_job, "whole", "--index", "flat")
    manifest = json.loads((whole / MANIFEST).read_text())
    assert manifest["complete"] and manifest["count"] == N_IMAGES + 1 and len(manifest["shards"]) == 3
    assert manifest["encoder"]["mean"] == [0.4, 0.5, 0.6] and manifest["encoder"]["image_size"] == 16
    assert manifest["index"]["type"] == "flat" and "rule" in manifest["index"]
    # stopped after one shard (the deterministic stop), then the same command again
    parts = _embed(image_job, "parts", "--index", "flat", "--max-shards", "1")
    assert not json.loads((parts / MANIFEST).read_text())["complete"] and len(_files(parts)) == 2
    leftover = parts / ".shard-000001.npy.tmp99999"  # as a job killed while writing leaves it
    leftover.write_bytes(b"half written")
    _embed(image_job, "parts", "--index", "flat")
    assert not leftover.exists()
    assert _files(parts) == _files(whole)
    assert (parts / "index.faiss").read_bytes() == (whole / "index.faiss").read_bytes()
    # the vectors are the encoder's, L2-normalised, in folder order
    vecs, ids = _vectors(whole)
    assert ids[0].endswith("im00.png") and ids[-1].endswith("zz_copy_of_03.png")
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # another job in the same folder is refused, naming what differs (a batch size changes the bits)
    for other in (["--dtype", "float16"], ["--batch-size", "3"]):
        with pytest.raises(SystemExit) as e:
            _embed(image_job, "whole", *other)
        assert e.value.code == 2


def test_query_json_is_the_brute_force_top_k(image_job, capsys):
    out = image_job / "whole" if (image_job / "whole" / MANIFEST).is_file() else _embed(image_job, "whole",
                                                                                          "--index", "flat")
    query = image_job / "images" / "im07.png"
    capsys.readouterr()
    assert main(["--out", str(out), "--query", str(query), "--top-k", "4", "--num-workers", "0"]) == 0
    printed = capsys.readouterr().out.splitlines()
    result = json.loads((out / "query.json").read_text())
    assert set(result) == {"query", "top_k", "index", "neighbours"} and result["index"] == "flat"
    hits = result["neighbours"]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4] and len(printed) == 4
    assert set(hits[0]) == {"rank", "id", "row", "similarity"} and hits[0]["id"].endswith("im07.png")
    vecs, ids = _vectors(out)  # brute force: the query image is row 7 of the corpus
    sims = vecs @ vecs[7] / np.linalg.norm(vecs, axis=1) / np.linalg.norm(vecs[7])
    expected = np.argsort(-sims, kind="stable")[:4]
    assert [h["row"] for h in hits] == expected.tolist()
    np.testing.assert_allclose([h["similarity"] for h in hits], sims[expected], atol=1e-5)
    assert [h["id"] for h in hits] == [ids[r] for r in expected]


@pytest.mark.slow
def test_ivfpq_search_finds_brute_force_neighbours(tmp_path):
    """IVF-PQ (approximate) over clustered vectors: each query's brute-force nearest row is among
    its 10 IVF-PQ neighbours for nearly every query; the rule records its parameters."""
    rng = np.random.default_rng(0)
    n, dim = 10_000, 32
    centres = rng.normal(size=(50, dim))
    vectors = (centres[rng.integers(0, 50, n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float32)
    spec = index_rule("auto", n, dim)
    assert spec["type"] == "flat"  # below the rule's size
    spec = index_rule("ivfpq", n, dim)
    assert (spec["nlist"], spec["m"], spec["nbits"]) == (256, 4, 8) and not spec["exact"]
    build_index(vectors, spec, tmp_path / "index.faiss")
    manifest = {"count": n, "index": spec}
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.integers(0, n, 20)
    found = 0
    for q in queries:
        best = int(np.argmax(unit @ unit[q]))
        found += best in [r for r, _ in search(tmp_path, manifest, torch.from_numpy(vectors[q]), 10)]
    assert found >= 15  # approximate: PQ codes of 4 x 8 bits
    with pytest.raises(ValueError, match="flat"):
        index_rule("ivfpq", 500, dim)


def test_duplicates_csv_has_the_planted_pair(image_job):
    out = image_job / "whole" if (image_job / "whole" / MANIFEST).is_file() else _embed(image_job, "whole")
    assert main(["--out", str(out), "--duplicates", "0.9999"]) == 0
    with open(out / "duplicates.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id_a", "id_b", "similarity"]
    pairs = {(Path(a).name, Path(b).name) for a, b, _ in rows[1:]}
    assert ("im03.png", "zz_copy_of_03.png") in pairs
    assert all(float(s) >= 0.9999 for *_, s in rows[1:])
    vecs, _ = _vectors(out)  # the CSV holds every pair above the threshold, each once
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    sims = unit @ unit.T
    assert len(rows) - 1 == int(np.triu(sims >= 0.9999, k=1).sum())
    whole, blocked = near_duplicates(vecs, 0.9999), near_duplicates(vecs, 0.9999, block=3)
    assert [p[:2] for p in whole] == [p[:2] for p in blocked] == [(3, 11)]


def test_text_corpus_from_a_tiny_bert_folder(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "dog", "sits", "runs", "the"]
    model = tmp_path / "bert"
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(str(model), safe_serialization=True)
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n")
    text = tmp_path / "sentences.tsv"
    text.write_text("id\tsentence\n1\ta cat sits\n2\tthe dog runs\n3\t\n4\ta cat sits\n")
    out = tmp_path / "out"
    assert main(["--checkpoint", f"hf:{model}", "--data", str(text), "--out", str(out), "--pooling", "mean",
                 "--dtype", "float16", "--no-progress"]) == 0
    vecs, ids = _vectors(out)
    assert vecs.dtype == np.float16 and vecs.shape == (3, 32) and ids == ["2", "3", "5"]  # file line numbers
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["modality"] == "text" and manifest["encoder"]["pooling"] == "mean"
    assert len(manifest["encoder"]["sha256"]) == 64
    assert main(["--out", str(out), "--duplicates", "0.999"]) == 0
    rows = (out / "duplicates.csv").read_text().splitlines()
    assert rows[1].startswith("2,5,")
    capsys.readouterr()
    assert main(["--out", str(out), "--query", "the dog runs", "--top-k", "1"]) == 0
    assert json.loads((out / "query.json").read_text())["neighbours"][0]["id"] == "3"
    # a text model on images: one line
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(model), "--data", str(tmp_path), "--out", str(tmp_path / "o2")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a text model" in err[0] and "sentences" in err[0]


@pytest.mark.parametrize("data, message", [("nothere", "no such folder"), ("no/such/folder", "does not exist"),
                                           ("imagefolder:/no/such/folder", "does not exist")])
def test_missing_folder_is_one_line(image_job, capsys, data, message):
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(image_job / "encoder.pt"), "--data", data, "--out", str(image_job / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_unreadable_image_is_refused_not_given_another_images_vector(image_job, tmp_path, capsys):
    folder = tmp_path / "images"
    shutil.copytree(image_job / "images", folder)
    (folder / "im07.png").write_bytes(b"not a png")  # in the second shard of 5
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(image_job / "encoder.pt"), "--data", str(folder), "--out",
              str(tmp_path / "o"), "--shard-size", "5", "--num-workers", "0", "--no-progress"])
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and "unreadable" in err[0] and "im07.png" in err[0]
    assert sorted(p.name for p in (tmp_path / "o").glob("shard-*.npy")) == ["shard-000000.npy"]


def test_help_names_the_file_format_and_the_command_is_installed(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: contrastive-embed") and ".npy" in text and "ids.json" in text
    cfg = (Path(__file__).resolve().parents[2] / "setup.cfg").read_text()
    assert "contrastive-embed = contrastive.eval.embed:main" in cfg


def _command(image_job: Path, out: Path) -> list[str]:
    return ["-m", "contrastive.eval.embed", "--checkpoint", str(image_job / "encoder.pt"), "--data",
            str(image_job / "images"), "--out", str(out), "--shard-size", "2", "--num-workers", "0", "--cpu"]


def _env() -> dict[str, str]:
    """A child process: this checkout, one thread (the byte-identity holds at one thread count)."""
    import os

    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def _run_child(image_job: Path, out: Path, *extra: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, *_command(image_job, out), *extra], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_write_the_shards_of_one(image_job, launch_two):
    import subprocess

    one = image_job / "one_process"
    _run_child(image_job, one)
    two = image_job / "two_processes"
    proc = subprocess.run([*launch_two.prefix(), *_command(image_job, two)], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _files(two) == _files(one) and len(_files(one)) == 12
    assert json.loads((two / MANIFEST).read_text())["complete"]


@pytest.mark.slow
def test_a_killed_job_continues_to_the_same_bytes(image_job):
    """SIGKILL once the first shard is on disk, then the same command: the files of a job never stopped."""
    import subprocess
    import sys
    import time

    whole = image_job / "never_stopped"
    _run_child(image_job, whole, "--batch-size", "1")  # small batches: the job can be caught part-way
    out = image_job / "killed"
    proc = subprocess.Popen([sys.executable, *_command(image_job, out), "--batch-size", "1"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "shard-000000.npy").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    done = list(out.glob("shard-*.npy"))
    assert 0 < len(done) < 6, "the job was not stopped part-way"
    _run_child(image_job, out, "--batch-size", "1")
    assert _files(out) == _files(whole)
